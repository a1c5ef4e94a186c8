"""The `preflight` step: the hosts the study rents, measured before any arm spends on them.

    gradshare preflight --study S                                     # one host (CPU ranks, or a rehearsal)
    gradshare preflight --study S --num-machines 2 --machine-rank 0 --main-process-ip 10.0.1.5 \\
        --main-process-port 29500                                     # host A; host B the same with rank 1

Run on every host with the arms' own launch parameters. For each socket setting of
`preflight.sockets`, the arms' processes start as the arms start (`accelerate launch`, the arms'
backend) and run `gradshare.hosts.probe`: the link with the arms' real buffers, sustained; its
capacity with the setting's flows; the host link (GPUs); each host's memory, GPU and disk; the
hosts' clock offset. Host A then times an upload to the tracking server's artifact store, asks
AWS whether the guard may stop the instances (a DryRun), records everything in a `preflight` run
(every figure a metric with its unit; the run's description one table), and says go or no-go:
the arms' hours and dollars, cross-zone included, projected from what was measured
(`gradshare.cost.measured`), against the deadline and the budget.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradshare.contract.errors import StudyError
from gradshare.contract.plan import Plan
from gradshare.contract.tags import NOTE, SOCKETS_BEST
from gradshare.cost import limits, measured, projection
from gradshare.hosts import probe as probe_mod
from gradshare.hosts import sockets
from gradshare.tracking import figures as study_figures
from gradshare.tracking import outbox, store
from gradshare.train.launch import Launch, check_launch, free_port, thread_env
from gradshare.train import failures

def buffers(plan: Plan, shapes: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """(dense's all-reduces per update, a compressed update's), bytes. Dense's are DDP's buckets
    of the FP32 gradient as it rebuilds them after the first backward: parameters in reverse order
    (about the order their gradients come), each bucket closed once it holds
    `powersgd.bucket_cap_mb` (checked against DDP's own in the tests). The compressed update's
    are what the kind of the candidate (or else of the first arm whose kind has any) sends from
    those buckets (`ArmKind.probe_buffers`); none where no kind has its own."""
    cap = plan.powersgd.bucket_cap_mb * 2**20
    buckets: list[list[tuple[int, ...]]] = [[]]
    size = 0
    for shape in reversed(shapes):  # the rebuilt buckets (after the first backward), as DDP fills them
        if size >= cap:
            buckets.append([])
            size = 0
        buckets[-1].append(shape)
        size += 4 * _numel(shape)
    dense = [sum(4 * _numel(s) for s in b) for b in buckets]
    arms = sorted(plan.arm_list(), key=lambda a: a.name != plan.arms.candidate)
    compressed = next((got for a in arms if (got := a.method.probe_buffers(a, plan, buckets)) is not None), [])
    return dense, compressed


PROBE_LOG_LINES = 80
_TRACEBACK = "Traceback (most recent call last):"


def probe_failure(log_text: str) -> str:
    """The cause of a failed probe launch, in one line: each failed rank's exit (torch elastic's
    summary) and the first error a rank raised (the line that ends its traceback), never the
    launcher's own ChildFailedError, which only says that a child failed."""
    errors = []
    for block in log_text.split(_TRACEBACK)[1:]:
        lines = [x for x in block.splitlines() if x.strip()]
        last = next((x.strip() for x in lines if not x.startswith((" ", "\t", "["))), None)
        if last and "ChildFailedError" not in last:
            errors.append(last)
    exits = failures.launcher_exits(log_text)
    said = "; ".join(f"rank {e.rank} on {e.host} " + (f"killed by {e.signal_name}" if e.signal_name
                                                      else f"exited {e.exitcode}") for e in exits)
    if errors:
        said = (said + ": " if said else "") + errors[0][:300]
    return said or " ".join(log_text.split())[-300:] or "the launcher wrote nothing"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _probe_command(plan: Plan, workdir: Path, launch: Launch, port: int) -> list[str]:
    n = max(plan.arms.processes(a) for a in plan.arms.names)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n),
           "--num_machines", str(launch.num_machines), "--mixed_precision", "no", "--dynamo_backend", "no",
           "--multi_gpu", "--machine_rank", str(launch.machine_rank), "--main_process_ip", launch.main_process_ip,
           "--main_process_port", str(port)]
    if plan.hardware.threads_per_process > 0:  # as the arms are launched: the compute share is theirs
        cmd += ["--num_cpu_threads_per_process", str(plan.hardware.threads_per_process)]
    return cmd + ["-m", probe_mod.__name__, "--workdir", str(workdir)]


def compute_probe(plan: Plan, shapes: list[tuple[int, ...]]) -> dict:
    """The `Probe` fields that time one rank's share of an update (`probe.compute_share`): the
    plan's model with the prepared vocabulary (the rows of its first parameter, the input embedding,
    as `parameter_shapes` and prepare's record list them), its documents, and the threads the arms'
    processes get."""
    src = plan.model.source
    threads = plan.hardware.threads_per_process
    vocab = shapes[0][0] if shapes and len(shapes[0]) == 2 else 0
    return {"model": src if src.startswith("hf:") else plan.model.config, "vocab_size": vocab,
            "docs_per_update": plan.schedule.docs_per_update, "micro_batch_docs": plan.schedule.micro_batch_docs,
            "doc_tokens": plan.data.max_doc_tokens,
            # as the arms are launched (`launch.launch_command`): a one-process CPU arm gets every core
            "threads_alone": threads if threads > 0 else (os.cpu_count() or 1), "threads_rank": threads}


def measure(plan: Plan, shapes, launch: Launch, log=print) -> dict:
    """Every socket setting's probe on this host's ranks; rank 0's results by setting (machine rank
    0), or {} on another host."""
    dense, psgd = buffers(plan, shapes)
    kind = sockets.backend(plan)
    ifname = sockets.interface(plan, launch.main_process_ip)
    base = launch.main_process_port or free_port()
    out = {}
    for k, setting in enumerate(plan.preflight.sockets):
        t, s = (int(x) for x in setting.split("x"))
        work = Path(tempfile.mkdtemp(prefix=f"gradshare-preflight-{setting}-"))
        try:
            probe_mod.write_probe(work, probe_mod.Probe(
                dense_buckets=dense, powersgd_buffers=psgd, sustain_s=plan.preflight.sustain_s,
                window_s=plan.preflight.window_s, device=plan.hardware.device,
                max_device_gib=plan.hardware.max_device_gib, error_buckets=dense,
                staging_bytes=plan.powersgd.staging_mb * 2**20, outbox=str(outbox.root()),
                label=setting, flows=t * s, **(compute_probe(plan, shapes) if k == 0 else {})))  # the share: once
            env = dict(os.environ, PYTHONUNBUFFERED="1", **thread_env(plan), **sockets.env_for(setting, kind, ifname))
            log(f"[gradshare] preflight: sockets {setting} ({kind}{', ' + ifname if ifname else ''}): "
                f"{plan.preflight.sustain_s:g} s of the arms' all-reduces ...")
            # each setting its own rendezvous port (host B counts the same way)
            port = base + k if launch.num_machines > 1 else free_port()
            with open(work / "launcher.log", "wb") as errs:
                # the first setting also builds the model and times 2 x (repeats + 1) updates
                timed_s = (2 * (probe_mod.Probe.compute_repeats + 1) * plan.arms.expected_update_s
                           + plan.arms.startup_s) if k == 0 else 0
                done = subprocess.run(_probe_command(plan, work, launch, port), env=env, stdout=errs,
                                      stderr=subprocess.STDOUT,
                                      timeout=plan.arms.startup_s + 3 * plan.preflight.sustain_s + 120 + timed_s)
            if done.returncode != 0:
                text = (work / "launcher.log").read_text(errors="replace")
                # the whole log to stderr (its folder is removed below), then the cause in one line
                print(f"[gradshare] preflight: the probe's log (sockets {setting}), its last {PROBE_LOG_LINES} "
                      f"lines:\n" + "\n".join(text.splitlines()[-PROBE_LOG_LINES:]), file=sys.stderr, flush=True)
                raise StudyError(f"preflight: the probe with sockets {setting} failed (exit {done.returncode}): "
                                 f"{probe_failure(text)}")
            if launch.machine_rank == 0:
                out[setting] = json.loads(probe_mod.result_path(work, 0).read_text())
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def upload_rate(megabytes: int, checkpoint_bytes: int, log=print) -> dict:
    """Seconds to put `megabytes` into the active run's artifacts, and the checkpoint's projected."""
    import mlflow

    if megabytes <= 0:
        return {}
    with tempfile.TemporaryDirectory(prefix="gradshare-upload-") as d:
        f = Path(d) / "upload_probe.bin"
        with open(f, "wb") as fh:
            for _ in range(megabytes):
                fh.write(os.urandom(2**20))
        t0 = time.perf_counter()
        mlflow.log_artifact(str(f), "preflight")
        s = time.perf_counter() - t0
    rate = megabytes * 2**20 / s
    log(f"[gradshare] preflight: {megabytes} MB uploaded to the artifact store in {s:.1f} s "
        f"({rate / 1e6:,.0f} MB/s): the checkpoint's {checkpoint_bytes / 1e9:.2f} GB in about "
        f"{checkpoint_bytes / rate:.0f} s")
    return {"bytes": megabytes * 2**20, "seconds": s, "Bps": rate, "checkpoint_s": checkpoint_bytes / rate}


def stop_permission(plan: Plan) -> str:
    """Whether the guard may stop the plan's instances (EC2 DryRun), in a word and a reason."""
    i = plan.infra
    if not i.instance_ids:
        return "not asked: the plan names no instances (infra.instance_ids)"
    import boto3  # the AWS SDK, only where the plan names instances

    try:
        boto3.client("ec2", region_name=i.aws_region).stop_instances(InstanceIds=list(i.instance_ids), DryRun=True)
    except Exception as exc:  # noqa: BLE001 - botocore's ClientError: its code says allowed or refused
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        if not code:
            raise
        if code == "DryRunOperation":
            return "allowed"
        return f"refused: {code} ({' '.join(str(exc).split())[:200]})"
    return "allowed"


def run_preflight(study: str, launch: Launch, log=print) -> dict:
    """The whole step on this host; on machine rank 0 inside the study's `preflight` run, which
    records the figures and the go/no-go. Returns the figures (machine rank 0) or {}."""
    import mlflow

    prep, plan = store.prepared_plan(study)
    check_launch(launch)
    shapes = study_figures.prepared_shapes(prep, plan)
    results = measure(plan, shapes, launch, log)
    if launch.machine_rank != 0:
        return {}
    figures = measured.summarize(plan, results)
    ckpt_bytes = 4 * sum(_numel(s) for s in shapes)
    figures["upload"] = upload_rate(plan.preflight.upload_mb, ckpt_bytes, log)
    figures["stop_permission"] = stop_permission(plan)
    run = mlflow.active_run()
    figures["run_id"] = run.info.run_id
    known = study_figures.read(study, prep, plan, shapes)
    # a GPU study: each arm's update from the GPU projection with the measured link and host link,
    # kept with the figures for the limits (which load no torch to recompute it)
    figures["per_update"] = projection.gpu_per_update(plan, study_figures.study_workload(prep, plan), figures)
    verdict = measured.go_no_go(plan, figures, known, limits.expected_startup_s(plan, known), time.time(),
                                limits.spent(plan, known.attempts))
    figures["go_no_go"] = verdict
    mlflow.log_dict(figures, study_figures.PREFLIGHT_FILE)
    mlflow.log_metrics(measured.metrics(figures))
    mlflow.set_tags({SOCKETS_BEST: figures["best"]})
    mlflow.log_params({"sockets_measured": ",".join(plan.preflight.sockets), "backend": figures["backend"],
                       "stop_permission": figures["stop_permission"][:250], "go": verdict["go"]})
    table = measured.table(figures)
    mlflow.set_tag(NOTE, table)  # the run's description: one screen
    log(table)
    return figures

