"""One training process of an arm. Started by `entrypoints.train` through accelerate:

    accelerate launch --num_processes 1 -m gradshare.train.worker --workdir W --arm single --run-id R
    accelerate launch --multi_gpu --num_processes 2 -m gradshare.train.worker --workdir W --arm dense --run-id R
    accelerate launch --multi_gpu --num_machines 2 --machine_rank 0 --main_process_ip HOST \\
        --main_process_port 29500 --num_processes 2 -m gradshare.train.worker ...   # two hosts

`W` holds the verified train inputs (plan.json, schedule.json, data/, tokenizer/,
seed_model/). Only rank 0 talks to MLflow (run `R`); the other ranks send what must
be logged (their host's wire bytes) to rank 0 through the process group; rank 0 records
through the run's outbox (`gradshare.tracking.outbox`), so a lost server stalls no update. Any rank
that fails writes `failure.rank<N>.txt` in `W` for the driver to report.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch

from gradshare.contract import metrics as M
from gradshare.cost.limits import Limits
from gradshare.data.tokenizer import load_tokenizer
from gradshare.hosts import sockets
from gradshare.inputs.workload import training_docs
from gradshare.hosts.metering import (
    gather,
    host_counters,
    ordered_labels,
    phase_lines,
    phases,
)
from gradshare.model.lm import save_model, seed_model
from gradshare.tracking.outbox import Outbox, ServerLost
from gradshare.train import env, failures, fullstate, heartbeat, profiling
from gradshare.train import faults as F
from gradshare.train import workdir as workdir_files
from gradshare.train.link_check import LinkTooSlow, check_link
from gradshare.train.loop import FullStatePolicy, LimitStop, TrainJob, train
from gradshare.train.memory import DeviceMemoryError, cap_device_memory
from gradshare.train.replicas import ReplicaMismatch, check_agree
from gradshare.train.result import StoreRefused, checkpoint_dir, record, signals_deferred
from gradshare.util.hashing import checkpoint_sha256, file_entries
from gradshare.util.devices import indexed
from gradshare.util.sources import set_determinism


STARTED_AT = time.time()  # this process's first line after the interpreter and torch (phase `launch`)


@dataclass
class _Rank:
    """One process of the arm once it is set up: who it is among the ranks, where it computes, and
    what it trains from; `phases_s` collects the arm's phase seconds as they pass."""
    workdir: Path
    arm: str
    plan: object
    rank: int
    world: int
    device: torch.device
    wait_for_everyone: object
    beat: heartbeat.Heartbeat
    faults: object
    wire_start: dict
    t_wall: float
    phases_s: dict = field(default_factory=dict)
    box: Outbox | None = None  # rank 0's records, through the outbox: a lost server stalls no update
    log: object = print


def run(workdir: Path, arm: str, run_id: str | None) -> None:
    """The arm's process: set up, train, then check the replicas and hand over its result."""
    r = _set_up(workdir, arm, run_id)
    model, tokenizer, res, seen = _train(r)
    _finish(r, model, tokenizer, res, seen)


def _set_up(workdir: Path, arm: str, run_id: str | None) -> _Rank:
    """The verified plan, the process group and this rank's device (capped before any model)."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    t_wall = time.perf_counter()
    beat = heartbeat.Heartbeat(workdir, int(os.environ.get("RANK", "0")))  # the train step watches it
    faults = F.from_env()
    faults.at_start(workdir, int(os.environ.get("RANK", "0")))
    wire_start = host_counters()  # before the process group exists: startup counts its set-up
    plan = workdir_files.verify(workdir)  # the handed-over files as verified: else a refusal, no attempt
    if plan.hardware.threads_per_process > 0:  # the launcher set OMP's; torch's own pool too
        torch.set_num_threads(plan.hardware.threads_per_process)
    # A rank waits for its peers at most as long as the launcher waits for the arm: a dead or
    # hung peer ends this rank with an error instead of a wait forever.
    limit = timedelta(seconds=plan.arms.timeout_s(plan.schedule.updates))
    if plan.hardware.rehearsal == "one-gpu" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # A rehearsal: every rank on the one visible GPU, over gloo (NCCL refuses two ranks on one
        # device; gloo carries DDP's broadcast and all-reduce of CUDA tensors through host memory).
        # The launcher's rendezvous variables (torchrun's) as ever; accelerate would pick
        # cuda:<local rank>, which does not exist here.
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=limit)
        rank, world, device = dist.get_rank(), dist.get_world_size(), torch.device("cuda", 0)
        torch.cuda.set_device(device)
        wait_for_everyone = dist.barrier
    else:
        accelerator = Accelerator(cpu=plan.hardware.device == "cpu",
                                  kwargs_handlers=[InitProcessGroupKwargs(timeout=limit)])
        # accelerate's device has no index in a one-process launch: resolved once, here
        rank, world, device = accelerator.process_index, accelerator.num_processes, indexed(accelerator.device)
        wait_for_everyone = accelerator.wait_for_everyone
    expected = plan.arms.processes(arm)
    if world != expected:
        raise RuntimeError(f"arm {arm} needs {expected} processes, launched with {world}")
    set_determinism(plan.hardware.deterministic, compiles=plan.hardware.compile)
    # Before the model exists: an arm that would not fit the study's card fails here too.
    cap_device_memory(plan.hardware.max_device_gib, device)
    return _Rank(workdir=workdir, arm=arm, plan=plan, rank=rank, world=world, device=device,
                 wait_for_everyone=wait_for_everyone, beat=beat, faults=faults, wire_start=wire_start,
                 t_wall=t_wall, box=Outbox(run_id, plan.arms.tracking_grace_s, background=True)
                 if rank == 0 and run_id else None, log=print if rank == 0 else (lambda *a, **k: None))


def _train(r: _Rank):
    """The seed model trained on the schedule: (model, tokenizer, the loop's result, the hash of
    each update's documents as trained, equal across arms)."""
    plan, workdir, box = r.plan, r.workdir, r.box
    torch.manual_seed(plan.study.seed)
    tokenizer = load_tokenizer(workdir / "tokenizer")
    model = seed_model(plan, workdir, r.device)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        # a model's own tokenizer with our chat markers added: room for them in the embedding
        model.resize_token_embeddings(len(tokenizer))
    # across hosts: a link that could not carry the arm is a refusal before any update (no attempt used)
    check_link(plan, r.arm, [tuple(p.shape) for p in model.parameters()], r.device, r.world, r.log)
    schedule = json.loads((workdir / workdir_files.SCHEDULE).read_text())
    docs = training_docs(workdir)

    seen = []  # per-update hash of the document ids actually trained on, equal across arms
    launched = float(os.environ.get(env.LAUNCHED_AT_ENV) or STARTED_AT)
    r.phases_s.update({"launch": STARTED_AT - launched, "setup": time.perf_counter() - r.t_wall})

    def on_step(u: int, metrics: dict, docs_sha: str) -> str | None:
        seen.append(docs_sha)
        r.phases_s.setdefault("first_update", metrics[M.STEP_S])
        if box is not None:
            box.metrics(metrics, step=u)
            try:
                box.check_grace(f"after update {u} of {plan.schedule.updates}")
            except ServerLost as exc:
                return str(exc)  # every rank stops after this update
        return None

    limits = Limits.read(workdir) if r.rank == 0 else None  # rank 0 decides; the others follow it
    full = _full_state(workdir, r.world, r.rank, box, r.log)
    if full.resume:
        seen.extend(schedule["update_sha256"][:full.resume["loop"]["update"]])
    profile = profiling.from_env(workdir, r.rank)
    res = train(TrainJob(plan, r.arm, model, tokenizer, docs, schedule, r.device, r.rank, r.world, on_step=on_step,
                         log=r.log, limits=limits, full_state=full, profile=profile, heartbeat=r.beat))
    r.beat.phase("finish")  # the replica check, the checkpoint and its upload: alive is what counts
    r.phases_s["updates"] = res.active_s
    if box is not None and profile is not None and profile.out.exists():
        box.artifacts(profile.out, "profile")
    return model, tokenizer, res, seen


def _finish(r: _Rank, model, tokenizer, res, seen: list[str]) -> None:
    """Replicas checked equal, rank 0's checkpoint written with signals deferred, the arm's
    summary (every rank's counters, threads and peaks) beside it, then recorded."""
    arm, workdir, rank, world, box, log, phases_s = r.arm, r.workdir, r.rank, r.world, r.box, r.log, r.phases_s
    # Only rank 0's weights are saved and scored: every other rank's must equal them, bit for bit.
    r.faults.after_training(model, rank)
    t0 = time.perf_counter()
    checked = check_agree(model, rank, world)
    phases_s["replica_check"] = time.perf_counter() - t0
    if world > 1:
        log(f"[{arm}] replicas agree: {checked} tensors equal on all {world} ranks "
            f"({phases_s['replica_check']:.2f}s)")

    # Collectives from here on: every rank sends its counters, rank 0 alone writes and logs.
    device = r.device
    starts = gather(r.wire_start, world)
    threads = gather(torch.get_num_threads(), world)  # what each rank really ran with
    peaks = gather((torch.cuda.max_memory_allocated(device) / 2**30, torch.cuda.max_memory_reserved(device) / 2**30)
                   if device.type == "cuda" else None, world)  # each rank's, against the plan's cap
    before_ckpt = gather(host_counters(), world)
    # Rank 0, from the checkpoint's first byte to the summary that says it is whole: SIGTERM and
    # SIGINT wait (the agent stops rank 0 when a peer dies; the arm's result must not die with it).
    with signals_deferred() if rank == 0 else contextlib.nullcontext():
        if rank == 0:
            t0 = time.perf_counter()
            # into the run's outbox: on local disk before any upload, kept until the store has it
            ckpt = save_model(model, tokenizer, checkpoint_dir(box, workdir))
            entries = file_entries(ckpt)
            save_s = phases_s["checkpoint_write"] = time.perf_counter() - t0
            r.faults.after_checkpoint()
        after_ckpt = gather(host_counters(), world)  # the other ranks wait here while rank 0 writes
        r.faults.checkpoint_written(rank)
        if rank == 0:
            wire = phases(starts, res.wire_first, res.wire, before_ckpt, after_ckpt)
            summary = M.summary_metrics(
                active_s=res.active_s, tokens=res.tokens, world=world, wall_s=time.perf_counter() - r.t_wall,
                save_s=save_s, ckpt_bytes=sum(e["bytes"] for e in entries), logical_bytes=res.logical_bytes,
                logical_bytes_post_warmup=res.logical_bytes_post_warmup, final_loss=res.losses[-1], wire=wire)
            for line in phase_lines(wire, after_ckpt):
                log(f"[{arm}] {line}")
            log(f"[{arm}] torch threads per rank: {threads}")
            # the checkpoint's identity is its weights' content, not files that embed library versions
            summary |= {M.REPLICA_TENSORS: checked} | {M.phase_s(k): v for k, v in phases_s.items()}
            for k, peak in enumerate(peaks):
                if peak is not None:
                    summary |= {M.peak_allocated_gib(k): peak[0], M.peak_reserved_gib(k): peak[1]}
                    log(f"[{arm}] rank {k}: peak {peak[0]:.1f} GiB allocated, {peak[1]:.1f} GiB reserved")
            result = {"metrics": summary, "checkpoint_sha256": checkpoint_sha256(ckpt),
                      "hosts": ordered_labels(after_ckpt), "losses": res.losses, "update_sha256": seen}
            (workdir / workdir_files.SUMMARY).write_text(json.dumps(result, indent=1))
    if rank == 0 and box is not None:
        box.params({"torch_threads_per_rank": ",".join(map(str, threads)), "socket_env": sockets.seen()})
        record(box, result, ckpt, log)  # the run's end too: a dead launcher costs nothing now
    r.faults.before_last_barrier(rank, (workdir / workdir_files.SUMMARY).exists)
    try:
        r.wait_for_everyone()
    except Exception as exc:  # noqa: BLE001 - a peer gone after the result was written costs nothing
        if not (workdir / workdir_files.SUMMARY).exists():
            raise
        log(f"[{arm}] a peer ended before the last barrier ({type(exc).__name__}); the arm's result is whole")


def _full_state(workdir: Path, world: int, rank: int, box, log):
    """The arm's full-state settings (`fullstate.json` from the driver) and, to resume, the
    state the driver verified into `resume/` (verified again here: nothing unchecked loads)."""

    policy = workdir / workdir_files.FULL_STATE_POLICY
    cfg = json.loads(policy.read_text()) if policy.exists() else {}
    resume = fullstate.load(workdir / "resume", world) if (workdir / "resume").exists() else None

    def on_saved(path: Path, manifest: dict) -> None:
        log(f"[gradshare] full state after update {manifest['update']}: {manifest['bytes']:,} bytes in "
            f"{manifest['save_s']:.2f}s")
        if box is not None:
            # the manifest last: a store that holds it holds every file it names
            for f in sorted(path.iterdir(), key=lambda f: f.name == fullstate.MANIFEST):
                box.artifacts(f, f"full_state/{path.name}")
            box.metrics({M.FULL_STATE_BYTES: manifest["bytes"], M.FULL_STATE_SAVE_S: manifest["save_s"]},
                        step=manifest["update"])

    if resume and box is not None:
        box.metrics({M.FULL_STATE_LOAD_S: resume["load_s"]}, step=resume["loop"]["update"])
    return FullStatePolicy(every=int(cfg.get("every", 0)), root=workdir / workdir_files.FULL_STATES,
                     on_saved=on_saved if rank == 0 else None, resume=resume)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--arm", required=True)
    ap.add_argument("--run-id", default="")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    rank = int(os.environ.get("RANK", "0"))
    try:
        run(workdir, args.arm, args.run_id or None)
    except BaseException as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]
        if isinstance(exc, (LimitStop, DeviceMemoryError, StoreRefused, ServerLost, ReplicaMismatch,
                            workdir_files.WorkdirChanged, LinkTooSlow)):  # `deadline: ...`, `out of device memory ...`
            reason = " ".join(str(exc).split())[:2000]
        if isinstance(exc, KeyboardInterrupt):
            reason = failures.INTERRUPTED_WORDS
        (workdir / f"failure.rank{rank}.txt").write_text(reason)
        traceback.print_exc()
        raise SystemExit(1)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
