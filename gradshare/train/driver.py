"""The train step for one arm, top to bottom: what would fail for nothing is refused
(`train.launch`, `train.refusals`), the attempt is claimed (or a stopped one continued,
`train.resume`), the arm's record started (`train.arm_record`), the workers launched and
watched (`train.supervise`), and the launch's end made the arm's (`train.outcome`).

Runs inside the arm's MLflow run (see `entrypoints.train`). Refusals come first and cost
nothing: a bad launch, a machine without the devices, train inputs (never the test set) whose
bytes differ from prepare's manifest, disks that could not keep the result; the run is tagged
a refusal, not an attempt. Then the arm is claimed in the study's ledger
(`gradshare.tracking.claims`), which refuses once the study is committed, while another arm
runs, after the arm finished, or when the plan's `arms.max_attempts` are used up; a claim that
succeeds is attempt N of the arm (tag `gradshare.attempt`). Only then are the deadline and the
budget checked (`cost.limits`), the worker processes launched with `accelerate launch` and
watched for at most the plan's timeout; rank 0 records the summary, the checkpoint and its
SHA-256 itself (`train.result`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from gradshare.contract.errors import StudyError
from gradshare.contract.plan import Plan
from gradshare.contract.tags import ATTEMPT, PLAN_SHA, PREPARE_RUN
from gradshare.cost import limits
from gradshare.hosts import sockets
from gradshare.tracking import claims, outbox, store
from gradshare.tracking import figures as study_figures
from gradshare.train import env as env_names
from gradshare.train import failures
from gradshare.train import workdir as workdir_files
from gradshare.train.arm_record import keep_text, last_update, start_record
from gradshare.train.launch import Launch, check_launch, launch_command, thread_env
from gradshare.train.outcome import settle
from gradshare.train.refusals import check_arm, check_devices, check_disks, verified_workdir
from gradshare.train.resume import Resume
from gradshare.train.supervise import Follower, stop_all, watch


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
        workdir = verified_workdir(prep, plan, tmp)
        check_disks(prep, plan, workdir)
        if resume is None:
            attempt = claim_arm(prep, plan, arm, run.info.run_id)
            done = 0
        else:
            attempt = int(run.data.tags.get(ATTEMPT, "1"))
            done = resume.manifest["update"]
        # the deadline and the bound: a refusal (no attempt) where the arm's projection passes either
        arm_limits = limits.arm_limits(plan, arm, study_figures.read(study, prep, plan), own_run_id=run.info.run_id,
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


def run_secondary_host(study: str, arm: str, launch: Launch) -> None:
    """Machine rank > 0 of a multi-host arm: verified inputs and workers, no MLflow run of its
    own (rank 0's run records the arm; this host's wire bytes reach it through the group)."""
    prep, plan = store.prepared_plan(study)
    check_arm(plan, arm)
    check_launch(launch)
    check_devices(plan, arm, launch)
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-host{launch.machine_rank}-"))
    try:
        _launch_workers(plan, arm, verified_workdir(prep, plan, tmp), "", launch,
                        arm_sockets(study, plan, arm, launch)[1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    settle(plan, arm, workdir, run_id, rc, stalled)


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
        figures = study_figures.preflight(study)
        if figures is None:  # nothing measured: NCCL's own choice (it tunes some clouds' NICs itself)
            return "default", {}, "no preflight ran: the libraries' defaults"
        setting, source = figures["best"], f"the fastest of the preflight run {figures['run_id']}"
    ifname = sockets.interface(plan, launch.main_process_ip)
    return setting, sockets.env_for(setting, sockets.backend(plan), ifname), source
