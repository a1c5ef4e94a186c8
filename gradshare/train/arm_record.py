"""The arm's MLflow record as the driver keeps it (rank 0 records the updates and the result
itself, `train.result`): the run's start (the attempt, the arm's row and launch as params, or the
resume's tags), texts kept as artifacts through the run's outbox, and what the record says when
the arm ends early: its last completed update, and where its trained weights wait.
"""
from __future__ import annotations

import os
import sys

from gradshare.contract import metrics as M
from gradshare.contract.plan import Plan
from gradshare.contract.tags import ATTEMPT, REHEARSAL, RESUMED, RESUMED_FULL_STATE_BYTES
from gradshare.tracking import connection, outbox
from gradshare.tracking.outbox import Outbox
from gradshare.train import result
from gradshare.train.env import LINK_ENV, RATE_ENV
from gradshare.train.launch import Launch
from gradshare.train.resume import Resume


def start_record(plan: Plan, arm: str, run, launch: Launch, full_state_every: int, resume: Resume | None,
                 attempt: int, done: int) -> None:
    """The run's start: for a new attempt its number and name, and the arm's row and launch as
    params; for a resume the update it continues after and the full state's size, as tags."""
    import mlflow

    if plan.rehearsal_note:
        mlflow.set_tag(REHEARSAL, plan.rehearsal_note)
        print(f"[gradshare] {plan.rehearsal_note}", flush=True)
    if resume is None:
        mlflow.set_tags({ATTEMPT: str(attempt), "mlflow.runName": f"train-{arm}-attempt{attempt}"})
        print(f"[gradshare] arm {arm}: attempt {attempt} of at most {plan.arms.max_attempts}", flush=True)
        row = plan.arm(arm)  # the arm's row as columns of the runs table: its kind, and the kind's own settings
        mlflow.log_params({"arm": arm, "kind": row.kind, "processes": row.processes, "device": plan.hardware.device,
                           **row.method.run_params(row),
                           "num_machines": launch.num_machines, "machine_rank": launch.machine_rank,
                           "main_process_ip": launch.main_process_ip, "attempt": attempt,
                           "timeout_s": plan.arms.timeout_s(plan.schedule.updates),
                           "link": link_description(plan, arm, launch),
                           "link_rate_mbit": link_rate(plan, arm, launch), "full_state_every": full_state_every})
    else:
        before = run.data.tags.get(RESUMED, "")
        mlflow.set_tags({RESUMED: f"{before},{done}" if before else str(done),
                         "mlflow.runName": f"train-{arm}-attempt{attempt}",
                         RESUMED_FULL_STATE_BYTES: str(resume.manifest["bytes"])})
        print(f"[gradshare] arm {arm}: attempt {attempt} resumed after update {done} from its full state "
              f"({resume.manifest['bytes']:,} bytes)", flush=True)


def link_description(plan: Plan, arm: str, launch: Launch) -> str:
    """What carried the arm's exchange: the launcher's word (`GRADSHARE_LINK`, set by the
    study and `scripts/two_hosts.py`) where given, else what the launch shows."""

    if plan.arms.processes(arm) == 1:
        return "none: one process"
    if os.environ.get(LINK_ENV):
        return os.environ[LINK_ENV]
    if launch.num_machines > 1:
        return f"network: {launch.num_machines} hosts, main host {launch.main_process_ip}"
    return "loopback: both ranks on one host, no byte crossed a link"


def link_rate(plan: Plan, arm: str, launch: Launch) -> str:
    """The link's rate in Mbit/s as the projection reads it: a number for an emulated link,
    `inf` for loopback, `none` for one process, `unknown` for a real network."""

    if plan.arms.processes(arm) == 1:
        return "none"
    if os.environ.get(RATE_ENV):
        return os.environ[RATE_ENV]
    return "unknown" if launch.num_machines > 1 else "inf"


def keep_text(plan: Plan, run_id: str, text: str, artifact_file: str) -> None:
    """An artifact of the run, through its outbox (kept there while the server is gone)."""
    try:
        box = Outbox(run_id, plan.arms.tracking_grace_s)
        if box.pending():  # behind records that wait (a lost server, a refused checkpoint): wait too
            box.hold()
        box.text(text, artifact_file)
    except Exception as exc:  # noqa: BLE001 - the arm's own outcome matters more than its log
        print(f"[gradshare] could not keep {artifact_file}: {connection.one_line(exc)}", file=sys.stderr, flush=True)


def last_update(run_id: str) -> int:
    """The arm's last completed update, from the record its step metrics are written to first:
    the run's outbox journal, where rank 0 appends each update's metrics before anything is sent
    (the server may not have the last ones yet when a fault ends the arm). The server only where
    no journal is left (all delivered, on another host)."""
    box = Outbox(run_id, 0)
    if (box.dir / outbox.JOURNAL).exists():
        return box.last_step(M.STEP_S)
    try:
        with outbox.fast_fail():
            return max((m.step for m in connection.client().get_metric_history(run_id, M.STEP_S)), default=0)
    except Exception:  # noqa: BLE001 - neither answers: nothing is known to be done
        return 0


def weights_hint(run_id: str, reason: str) -> str:
    """Where the arm's trained weights wait in its outbox (the store does not have them yet), the
    words that end its reason: where they are and the command that delivers them; else nothing."""
    if not run_id or "gradshare upload" in reason:
        return ""
    box = Outbox(run_id, 0)
    if not result.weights_wait(box):
        return ""
    return f"; the trained weights are kept in {box.dir}: `gradshare upload {box.dir}` delivers them"
