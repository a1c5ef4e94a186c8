"""The train step around the worker processes: claim, fetch and verify, launch, record.

Runs inside the arm's MLflow run (see `entrypoints.train`). Refusals come first and
cost nothing (a machine without the devices, a bad launch): the run is tagged a
refusal, not an attempt. Then the arm is claimed in the study's ledger
(`gradshare.tracking.claims`), which refuses once the study is committed, while another arm
runs, after the arm finished, or when the plan's `arms.max_attempts` are used up; a
claim that succeeds is attempt N of the arm (tag `gradshare.attempt`). Only then are
the train inputs (never the test set) downloaded and checked byte for byte against the
manifest, the worker processes launched with `accelerate launch` and waited for at most
the plan's timeout, and the summary, the step-128 checkpoint and its SHA-256 recorded.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.plan import Plan
from gradshare.contract.tags import ATTEMPT, PLAN_SHA, PREPARE_RUN
from gradshare.cost import limits, measured
from gradshare.hosts import sockets
from gradshare.tracking import claims, outbox, store
from gradshare.tracking.outbox import Outbox
from gradshare.train import env as env_names
from gradshare.train import failures, result
from gradshare.train import workdir as workdir_files
from gradshare.train.arm_record import keep_text, last_update, start_record, weights_hint
from gradshare.train.launch import Launch, check_launch, launch_command, thread_env
from gradshare.train.link_check import LINK_REFUSAL
from gradshare.train.resume import Resume
from gradshare.train.supervise import Follower, stop_all, watch


def check_devices(plan: Plan, arm: str, launch: Launch) -> None:
    need = plan.arms.processes(arm)
    if plan.hardware.device != "cuda":
        return
    import torch  # here, not above: on CPU the driver never loads torch (about 2 s per arm)

    if need % launch.num_machines:
        raise Refusal(f"arm {arm} needs {need} GPUs, which do not split over "
                        f"{launch.num_machines} machines")
    # a rehearsal puts every process of the arm on the one GPU (`hardware.rehearsal`)
    per_host = 1 if plan.hardware.rehearsal else need // launch.num_machines
    have = torch.cuda.device_count()
    if have < per_host:
        where = "a machine with a CUDA GPU" if per_host == 1 else f"a host with {per_host} CUDA GPUs"
        hint = f"run it on {where}"
        if need > 1 and launch.num_machines == 1:
            hint += (", or on two hosts with one GPU each (-P num_machines=2 -P machine_rank=0|1 "
                     "-P main_process_ip=HOST on both)")
        raise Refusal(f"arm {arm} needs {need} CUDA device(s), {per_host} on this host, and this host has "
                        f"{have}: {hint}; nothing was trained, no attempt used")


def check_arm(plan: Plan, arm: str) -> None:
    """Refuse an arm that is not a row of the study's plan (`arms.rows`), naming its arms."""
    if arm not in plan.arms.names:
        raise Refusal(f"arm {arm!r} is not an arm of the study's plan: choose one of {', '.join(plan.arms.names)}")


def claim_arm(prep, plan: Plan, arm: str, own_run_id: str) -> int:
    """Take the arm's start in the study's ledger (an arm `check_arm` passed); returns the attempt
    number or refuses."""
    index = claims.append(prep.info.run_id, "train", arm, own_run_id)
    return claims.decide_train(claims.entries(prep.info.run_id, before=index), arm, plan.arms.max_attempts)


def arm_sockets(study: str, plan: Plan, arm: str, launch: Launch) -> tuple[str, dict[str, str], str]:
    """(the socket setting, its environment for the workers, where it comes from) of a
    multi-process arm: the plan's `hardware.sockets`, or with `auto` the study's preflight's
    fastest, else nothing set (`gradshare.hosts.sockets`)."""
    if plan.arms.processes(arm) == 1:
        return "-", {}, "one process: no sockets"
    setting, source = plan.hardware.sockets, "the plan's hardware.sockets"
    if setting == "auto":
        figures = measured.latest(study)
        if figures is None:  # nothing measured: NCCL's own choice (it tunes some clouds' NICs itself)
            return "default", {}, "no preflight ran: the libraries' defaults"
        setting, source = figures["best"], f"the fastest of the preflight run {figures['run_id']}"
    ifname = sockets.interface(plan, launch.main_process_ip)
    return setting, sockets.env_for(setting, sockets.backend(plan), ifname), source


def _launch_workers(plan: Plan, arm: str, workdir: Path, run_id: str, launch: Launch,
                    extra_env: dict[str, str] | None = None) -> None:
    cmd = launch_command(plan, arm, workdir, run_id, launch)
    limit = plan.arms.timeout_s(plan.schedule.updates)
    print(f"[gradshare] launching (time limit {limit:.0f}s):", " ".join(cmd), flush=True)
    # The workers' and the launcher's stderr (library warnings, tracebacks, torch elastic's
    # failure summary) go to a file, the run's log: the console gets gradshare's own lines from
    # it, and a failure one line (`failures`). A file, not a pipe: the workers outlive this
    # process if it dies, and must never write into a closed pipe.
    log_path = workdir / workdir_files.WORKERS_LOG
    env = dict(os.environ, PYTHONUNBUFFERED="1", **thread_env(plan), **{outbox.ENV: str(outbox.root())},
               **{env_names.DRIVER_PID_ENV: str(os.getpid()), env_names.LAUNCHED_AT_ENV: f"{time.time():.3f}"},
               **(extra_env or {}))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stderr=log)
    follow = Follower(log_path)
    stalled = None
    try:
        rc = watch(plan, arm, proc, workdir, limit, launch)
    except StudyError as exc:  # stalled or timed out: every process stopped; how far the arm got
        rc, stalled = None, exc
    finally:  # an interrupt or error in this process must not leave ranks behind, orphans included
        stop_all(proc, workdir)
        follow.stop()
        if run_id:  # the run's log, whatever happened
            keep_text(plan, run_id, log_path.read_text(errors="replace"), "log/workers.txt")
    if rc != 0 and _trained_whole(workdir):
        # Every update done and the checkpoint written (rank 0's summary, no rank's reason): a
        # process that died or hung after that (the launcher, a rank killed after the checkpoint,
        # a rank stuck in the last barrier, rank 0 stopped while it recorded) costs nothing. The
        # arm is recorded whole, here if need be.
        how = f"the launcher ended with code {rc}" if stalled is None else f"the arm was stopped ({stalled})"
        print(f"[gradshare] arm {arm}: {how} after every update and the checkpoint were done: the arm is "
              f"recorded whole", file=sys.stderr, flush=True)
        if run_id:
            summary = json.loads((workdir / workdir_files.SUMMARY).read_text())
            result.complete(Outbox(run_id, plan.arms.tracking_grace_s), summary,
                            lambda line: print(line, file=sys.stderr, flush=True))
        return
    if stalled is not None:
        last = f"; last completed update {last_update(run_id)} of {plan.schedule.updates}" if run_id else ""
        raise StudyError(f"{stalled}{last}{weights_hint(run_id, str(stalled))}") from None
    if rc != 0:
        reason, details = failures.explain(workdir, arm, rc)
        if reason.startswith(failures.INTERRUPTED_WORDS):  # Ctrl-C reached the ranks (their process group): an interrupt
            if run_id:
                keep_text(plan, run_id, details, "failure/details.txt")
            raise KeyboardInterrupt(reason)
        if reason.startswith((workdir_files.WORKDIR_CHANGED, LINK_REFUSAL)):  # the machine's fault: no attempt used
            if run_id:
                keep_text(plan, run_id, details, "failure/details.txt")
            raise Refusal(reason)
        if run_id:
            keep_text(plan, run_id, details, "failure/details.txt")
            if not reason.startswith(failures.SAYS_WHERE):
                reason += f"; last completed update {last_update(run_id)} of {plan.schedule.updates}"
            reason += weights_hint(run_id, reason)
        print(f"[gradshare] arm {arm}: the full chain of errors is in the run's failure/details.txt",
              file=sys.stderr, flush=True)
        raise StudyError(reason)


def _trained_whole(workdir: Path) -> bool:
    """Rank 0 wrote the arm's result (every update, the checkpoint and its hash) and no rank a
    reason of its own (a store that refused the checkpoint, a replica mismatch)."""
    return (workdir / workdir_files.SUMMARY).exists() and not failures.rank_reasons(workdir)


def _verified_workdir(prep, plan: Plan, tmp: Path) -> Path:
    """The train inputs, every byte checked against prepare's manifest; a mismatch is a refusal
    (the store's fault, not the method's: the arm keeps its attempt, and trains once fixed)."""
    try:
        workdir = store.verified_inputs(prep, plan, tmp, store.TRAIN_INPUTS)
    except StudyError as exc:
        raise Refusal(f"{exc}; nothing was trained, no attempt used") from None
    workdir_files.write_plan(workdir, plan)
    return workdir


def run_arm(study: str, arm: str, run, launch: Launch = Launch(), full_state_every: int = 0,
            resume: Resume | None = None) -> dict:
    """The whole train step for one arm inside its MLflow run (machine rank 0); with `resume`,
    the stopped attempt's own run, reopened, continuing from its full state."""
    import mlflow

    prep, plan = store.prepared_plan(study)
    mlflow.set_tags({PLAN_SHA: plan.sha256(), PREPARE_RUN: prep.info.run_id})
    check_arm(plan, arm)
    check_launch(launch, full_state_every)
    check_devices(plan, arm, launch)
    # Scratch of this step alone: removed when it ends, whatever happened.
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-"))
    try:
        # Everything the machine can get wrong is checked before the attempt is claimed: a
        # refusal, not an attempt (the inputs' bytes, the disks the arm writes to).
        workdir = _verified_workdir(prep, plan, tmp)
        check_disks(prep, plan, workdir)
        if resume is None:
            attempt = claim_arm(prep, plan, arm, run.info.run_id)
            done = 0
        else:
            attempt = int(run.data.tags.get(ATTEMPT, "1"))
            done = resume.manifest["update"]
        # the deadline and the bound: a refusal (no attempt) where the arm's projection passes either
        arm_limits = limits.before_arm(study, prep, plan, arm, own_run_id=run.info.run_id,
                                       updates_left=plan.schedule.updates - done,
                                       extra_spent=resume.spent_usd if resume else 0.0)
        setting, socket_env, source = arm_sockets(study, plan, arm, launch)
        start_record(plan, arm, run, launch, full_state_every, resume, attempt, done)
        if resume is None:
            mlflow.log_params({"sockets": setting, "sockets_source": source[:250]})
        arm_limits.write(workdir)
        (workdir / workdir_files.FULL_STATE_POLICY).write_text(json.dumps({"every": full_state_every}))
        if resume is not None:
            shutil.copytree(resume.state_dir, workdir / "resume")
        try:
            _launch_workers(plan, arm, workdir, run.info.run_id, launch, socket_env)
        except KeyboardInterrupt as exc:  # the workers are stopped by now: say how far the arm got
            raise KeyboardInterrupt(f"{str(exc) or failures.INTERRUPTED_WORDS}; last completed update "
                                    f"{last_update(run.info.run_id)} of {plan.schedule.updates}") from None
        # rank 0 recorded the summary, the checkpoint and the run's end itself (`train.result`)
        return json.loads((workdir / workdir_files.SUMMARY).read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkpoint_bytes(prep, plan: Plan) -> int:
    """What the arm's final checkpoint will take on disk: its FP32 weights, by the parameter
    shapes prepare recorded (`model_shapes.json`), plus 5% and 64 MiB for the config, the
    tokenizer and the file system's slack."""

    weights = sum(math.prod(s) for s in limits.prepared_shapes(prep, plan)) * 4
    return int(weights * 1.05) + 64 * 2**20


def check_disks(prep, plan: Plan, workdir: Path) -> None:
    """A refusal, before the claim, where the arm could not keep its result: the outbox (where
    rank 0 writes the final checkpoint, `train.result`) or the working directory not writable,
    or the outbox's disk without room for the checkpoint."""
    box_root = outbox.root()
    for where, path in (("the outbox ($GRADSHARE_OUTBOX)", box_root), ("the arm's working directory", workdir)):
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".gradshare-write-check-{os.getpid()}"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as exc:
            raise Refusal(f"{where} {path} is not writable ({exc.strerror or exc}): the arm could not keep "
                            f"its checkpoint; nothing was trained, no attempt used") from None
    need, free = checkpoint_bytes(prep, plan), shutil.disk_usage(box_root).free
    if free < need:
        raise Refusal(f"the disk of the outbox {box_root} has {free:,} bytes free, and the arm's final "
                        f"checkpoint needs {need:,}: free space or point $GRADSHARE_OUTBOX at a larger disk; "
                        f"nothing was trained, no attempt used")


def run_secondary_host(study: str, arm: str, launch: Launch) -> None:
    """Machine rank > 0 of a multi-host arm: verified inputs and workers, no MLflow run of its
    own (rank 0's run records the arm; this host's wire bytes reach it through the group)."""
    prep, plan = store.prepared_plan(study)
    check_arm(plan, arm)
    check_launch(launch)
    check_devices(plan, arm, launch)
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-host{launch.machine_rank}-"))
    try:
        _launch_workers(plan, arm, _verified_workdir(prep, plan, tmp), "", launch,
                        arm_sockets(study, plan, arm, launch)[1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
