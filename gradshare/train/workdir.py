"""The arm's work directory: the files the train driver hands its workers, and those they hand
back. One home for their names; the plan crosses with its hash, which every worker verifies.

    <workdir>/plan.json        the plan (`write_plan` / `read_plan`)
    <workdir>/schedule.json    ... and the verified train inputs beside it (data/, tokenizer/, seed_model/)
    <workdir>/fullstate.json   how often to save a full state (the driver's --full-state-every)
    <workdir>/full_state/      where rank 0 writes them; a resumed run's is downloaded here
    <workdir>/summary.json     rank 0's result, for the driver
    <workdir>/workers.log      the workers' and the launcher's stderr
"""
from __future__ import annotations

from pathlib import Path

from gradshare.contract.errors import StudyError
from gradshare.contract.plan import PLAN_FILE, Plan, PlanError, plan_from_json, plan_json
from gradshare.tracking.store import VERIFIED, verify_again

SCHEDULE = "schedule.json"
FULL_STATE_POLICY = "fullstate.json"
FULL_STATES = "full_state"
SUMMARY = "summary.json"
WORKERS_LOG = "workers.log"


def write_plan(workdir: Path, plan: Plan) -> None:
    (Path(workdir) / PLAN_FILE).write_text(plan_json(plan))


WORKDIR_CHANGED = "workdir:"  # the reason of a worker whose handed-over files changed: a refusal


class WorkdirChanged(StudyError):
    """A file of the arm's working directory changed after the driver verified it: the machine's
    fault, never the method's, so the train step refuses (no attempt used) instead of failing."""


def read_plan(workdir: Path) -> Plan:
    """The plan the driver handed over; WorkdirChanged where it no longer reads or no longer
    hashes to its plan_sha256, naming the file."""
    path = Path(workdir) / PLAN_FILE
    try:
        return plan_from_json(path.read_text(), str(path))
    except (OSError, ValueError, PlanError) as exc:  # unreadable, not JSON, or another plan
        raise WorkdirChanged(f"{WORKDIR_CHANGED} {path} changed after the arm's launch ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:300]}); nothing was trained, no attempt used: "
                             f"train again") from None


def verify(workdir: Path) -> Plan:
    """The plan and every verified input of the working directory, as the driver handed them over
    (`store.verify_again`); WorkdirChanged naming the first file that changed."""
    plan = read_plan(workdir)
    if (Path(workdir) / VERIFIED).exists():
        try:
            verify_again(Path(workdir))
        except StudyError as exc:
            raise WorkdirChanged(f"{WORKDIR_CHANGED} {exc}; nothing was trained, no attempt used: train again") \
                from None
    return plan
