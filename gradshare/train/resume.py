"""Resume: a stopped attempt (FAILED or KILLED) continued in its own run from its last complete
full state, checked before the run is reopened (the run is the arm's, it stopped, the ledger lets
it go on, the full state's bytes verify); a Refusal naming what is missing otherwise.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from gradshare.contract.errors import Refusal
from gradshare.contract.tags import ARM, FAILURE, REFUSAL, STUDY
from gradshare.cost import limits
from gradshare.tracking import claims, connection, store, study_runs
from gradshare.train import fullstate
from gradshare.train.fullstate import MANIFEST


@dataclass(frozen=True)
class Resume:
    """A stopped attempt to continue in its own run, from its last full state (verified)."""
    run_id: str
    state_dir: Path
    manifest: dict
    spent_usd: float  # what the attempt cost before it stopped (its run is reopened)


def latest_full_state(run_id: str) -> str | None:
    """Artifact path of the run's newest complete full state (`full_state/uNNNNN` with a manifest)."""

    c = connection.client()
    dirs = sorted((a.path for a in c.list_artifacts(run_id, "full_state") if a.is_dir), reverse=True)
    for d in dirs:
        if any(a.path.endswith("/" + MANIFEST) for a in c.list_artifacts(run_id, d)):
            return d
    return None


def check_resume(study: str, arm: str, run_id: str) -> Resume:
    """Everything a resume needs, before the stopped run is reopened; a Refusal otherwise."""

    prep, plan = store.prepared_plan(study)
    try:
        run = connection.client().get_run(run_id)
    except Exception:  # noqa: BLE001 - any lookup failure is a run that is not there
        raise Refusal(f"resume_from={run_id}: no such run") from None
    if run.data.tags.get(STUDY) != study or run.data.tags.get(ARM) != arm:
        raise Refusal(f"resume_from={run_id} is not a train run of arm {arm} in study {study!r}")
    if run.data.tags.get(REFUSAL) == "true":
        raise Refusal(f"resume_from={run_id} was refused ({run.data.tags.get(FAILURE)}), not an attempt: "
                        f"nothing to resume")
    if run.info.status not in ("FAILED", "KILLED"):
        raise Refusal(f"resume_from={run_id} is {run.info.status}: only a stopped (FAILED or KILLED) arm resumes")
    index = claims.append(prep.info.run_id, "resume", arm, run_id)
    claims.decide_resume(claims.entries(prep.info.run_id, before=index), arm, run_id)
    path = latest_full_state(run_id)
    if path is None:
        raise Refusal(f"run {run_id} saved no complete full state (train with -P full_state_every=N): "
                        f"nothing to resume from")
    local = study_runs.download(run_id, path, Path(tempfile.mkdtemp(prefix="gradshare-resume-")))
    try:
        manifest = fullstate.verify(local, plan.arms.processes(arm))
    except fullstate.FullStateError as exc:
        raise Refusal(f"the full state {path} of run {run_id} is refused: {exc}") from None
    return Resume(run_id, local, manifest, limits.run_spend(plan, run))
