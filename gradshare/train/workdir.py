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

from gradshare.contract.plan import PLAN_FILE, Plan, plan_from_json, plan_json

SCHEDULE = "schedule.json"
FULL_STATE_POLICY = "fullstate.json"
FULL_STATES = "full_state"
SUMMARY = "summary.json"
WORKERS_LOG = "workers.log"


def write_plan(workdir: Path, plan: Plan) -> None:
    (Path(workdir) / PLAN_FILE).write_text(plan_json(plan))


def read_plan(workdir: Path) -> Plan:
    """The plan the driver handed over, refused (PlanError) where it no longer hashes to its plan_sha256."""
    path = Path(workdir) / PLAN_FILE
    return plan_from_json(path.read_text(), str(path))
