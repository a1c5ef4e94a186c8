"""`commit`: seal every arm's final model before any test case is scored.

The commit is claimed in the study's ledger (`gradshare.tracking.claims`): of two commits at
once exactly one proceeds, and it refuses while an arm still runs. It seals what the
ledger holds before its own claim: for each arm of the plan, every attempt with its
status and reason, and the arm's outcome — its FINISHED attempt with the checkpoint's
weights hash (`hashing.checkpoint_sha256`, the tag train recorded) and the bytes of its
config and tokenizer files, or its last FAILED attempt with the reason. An arm never
attempted counts as unavailable and gets a FAILED train run created for it (with the
reason it was refused, if it was), so that it stays visible. The commitment is
`commitment.json` on the commit run; from then on `train` refuses new candidates and
`score` accepts only the committed bytes.
"""
from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

from gradshare.contract import metrics as M
from gradshare.contract.tags import (
    ATTEMPT,
    CKPT_SHA,
    COMMITTED,
    FAILURE,
    PLAN_SHA,
    REHEARSAL,
    RESUMED,
)
from gradshare.tracking import claims, connection, store, study_runs
from gradshare.tracking.orphans import COMMITMENT_FILE
from gradshare.train import faults


def arm_entry(study: str, arm: str, plan_sha: str, prefix: list[claims.Entry]) -> dict:
    """The arm's outcome and every attempt of it, from the ledger entries before the commit."""
    attempts = claims.attempts(prefix, arm)
    for a in attempts:
        run = connection.client().get_run(a["run_id"])
        if a["status"] == "FINISHED":
            a["checkpoint_sha256"] = run.data.tags.get(CKPT_SHA)
        a.update(full_state_record(run))
    finished = [a for a in attempts if a["status"] == "FINISHED" and a.get("checkpoint_sha256")]
    if finished:
        a = finished[0]
        with tempfile.TemporaryDirectory(prefix="gradshare-commit-") as tmp:
            files = store.checkpoint_files(a["run_id"], Path(tmp))
        return {"arm": arm, "run_id": a["run_id"], "status": "FINISHED",
                "checkpoint_sha256": a["checkpoint_sha256"], "checkpoint_files": files, "attempts": attempts}
    if attempts:
        a = attempts[-1]
        reason = a["failure_reason"] or f"train run ended {a['status']} without a reason"
        return {"arm": arm, "run_id": a["run_id"], "status": "FAILED", "failure_reason": reason,
                "attempts": attempts}
    refused = [e for e in prefix if e.step == "train" and e.arm == arm and e.refusal]
    reason = f"arm {arm} was never started before commit: unavailable"
    if refused:
        reason += f" (its last start was refused: {refused[-1].reason})"
    return {"arm": arm, "run_id": _unavailable_run(study, arm, plan_sha, reason), "status": "FAILED",
            "failure_reason": reason, "attempts": []}


def full_state_record(run) -> dict:
    """Whether an attempt was resumed (after which updates) and its full states' size and seconds."""

    m, out = run.data.metrics, {}
    if run.data.tags.get(RESUMED):
        out["resumed_after_updates"] = [int(x) for x in run.data.tags[RESUMED].split(",")]
    for key, name in ((M.FULL_STATE_BYTES, "full_state_bytes"), (M.FULL_STATE_SAVE_S, "full_state_save_s"),
                      (M.FULL_STATE_LOAD_S, "full_state_load_s")):
        if key in m:
            out[name] = m[key]
    return out


def _unavailable_run(study: str, arm: str, plan_sha: str, reason: str) -> str:
    """A FAILED train run for an arm that never ran, so that it stays visible."""
    import mlflow

    c = connection.client()
    exp = mlflow.get_experiment_by_name(study)
    name = f"train-{arm}-unavailable"
    # one per arm: a commit run again after one that died (its commitment void) reuses it
    for run in study_runs.search(study, "train", arm, status="FAILED"):
        if run.data.tags.get("mlflow.runName") == name and ATTEMPT not in run.data.tags:
            return run.info.run_id
    tags = study_runs.study_tags(study, "train", plan_sha, arm) | {
        FAILURE: reason,
        "mlflow.runName": name}
    run = c.create_run(exp.experiment_id, tags=tags)
    c.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id


def commit_study(study: str, own_run_id: str) -> dict:
    import mlflow

    prep, plan = store.prepared_plan(study)
    mlflow.set_tag(PLAN_SHA, plan.sha256())
    index = claims.append(prep.info.run_id, "commit", None, own_run_id)
    prefix = claims.entries(prep.info.run_id, before=index)
    claims.decide_commit(prefix)
    arms = [arm_entry(study, arm, plan.sha256(), prefix) for arm in plan.arms.names]
    commitment = {"study": study, "plan_sha256": plan.sha256(), "prepare_run_id": prep.info.run_id,
                  "committed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "ledger_index": index, "max_attempts": plan.arms.max_attempts, "arms": arms}
    if note := plan.rehearsal_note:  # sealed with the arms: nobody takes a rehearsal for the study
        commitment["rehearsal"] = note
        mlflow.set_tag(REHEARSAL, note)
    mlflow.log_dict(commitment, COMMITMENT_FILE)
    faults.after_commitment()  # a fault switch of the tests: killed here, holding the file
    mlflow.set_tag(COMMITTED, "true")
    mlflow.MlflowClient().set_experiment_tag(mlflow.get_experiment_by_name(study).experiment_id,
                                             COMMITTED, own_run_id)
    return commitment
