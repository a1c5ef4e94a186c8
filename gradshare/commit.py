"""`commit`: seal every arm's final model before any test case is scored.

For each arm of the plan: its FINISHED train run with a checkpoint hash, or its
FAILED run with the reason; an arm never started counts as unavailable and gets a
FAILED train run created for it, so that it stays visible. The commitment is
`commitment.json` on the commit run; from then on `train` refuses new candidates
and `score` accepts only the committed bytes.
"""
from __future__ import annotations

import datetime as dt

from gradshare import tracking as T


def arm_entry(study: str, arm: str, plan_sha: str) -> dict:
    runs = T.search(study, "train", arm)
    running = [r for r in runs if r.info.status in ("RUNNING", "SCHEDULED")]
    if running:
        raise T.StudyError(f"arm {arm} is still running (run {running[0].info.run_id}); commit after "
                           f"every arm has ended")
    finished = [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get(T.CKPT_SHA)]
    if len(finished) > 1:
        raise T.StudyError(f"arm {arm} has {len(finished)} finished train runs "
                           f"({', '.join(r.info.run_id for r in finished)}); a study trains each arm once")
    if finished:
        r = finished[0]
        return {"arm": arm, "run_id": r.info.run_id, "status": "FINISHED",
                "checkpoint_sha256": r.data.tags[T.CKPT_SHA]}
    failed = [r for r in runs if r.info.status in ("FAILED", "KILLED")]
    if failed:
        r = failed[-1]
        reason = r.data.tags.get(T.FAILURE) or f"train run ended {r.info.status} without a reason"
        return {"arm": arm, "run_id": r.info.run_id, "status": "FAILED", "failure_reason": reason}
    return {"arm": arm, "run_id": _unavailable_run(study, arm, plan_sha), "status": "FAILED",
            "failure_reason": f"arm {arm} was never started before commit: unavailable"}


def _unavailable_run(study: str, arm: str, plan_sha: str) -> str:
    """A FAILED train run for an arm that never ran, so that it stays visible."""
    import mlflow

    c = T.client()
    exp = mlflow.get_experiment_by_name(study)
    tags = T.study_tags(study, "train", plan_sha, arm) | {
        T.FAILURE: f"arm {arm} was never started before commit: unavailable",
        "mlflow.runName": f"train-{arm}-unavailable"}
    run = c.create_run(exp.experiment_id, tags=tags)
    c.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id


def commit_study(study: str, own_run_id: str) -> dict:
    import mlflow

    from gradshare.train.driver import load_prepared_plan

    prep, plan = load_prepared_plan(study)
    mlflow.set_tag(T.PLAN_SHA, plan.sha256())
    earlier = [r for r in T.search(study, "commit", status="FINISHED") if r.info.run_id != own_run_id]
    if earlier:
        raise T.StudyError(f"study {study!r} is already committed (run {earlier[0].info.run_id}); "
                           f"a commitment is made once")
    arms = [arm_entry(study, arm, plan.sha256()) for arm in plan.arms.names]
    commitment = {"study": study, "plan_sha256": plan.sha256(), "prepare_run_id": prep.info.run_id,
                  "committed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "arms": arms}
    mlflow.log_dict(commitment, "commitment.json")
    mlflow.set_tag(T.COMMITTED, "true")
    mlflow.MlflowClient().set_experiment_tag(mlflow.get_experiment_by_name(study).experiment_id,
                                             T.COMMITTED, own_run_id)
    return commitment


def load_commitment(study: str) -> tuple[object, dict]:
    """The study's commit run and its commitment, or a refusal that says to commit first."""
    import json

    runs = T.search(study, "commit", status="FINISHED")
    if not runs:
        raise T.StudyError(f"study {study!r} is not committed: no test case is scored before every "
                           f"candidate is sealed. Run `mlflow run . -e commit --env-manager local "
                           f"-P study={study}` first")
    return runs[0], json.loads(T.download(runs[0].info.run_id, "commitment.json").read_text())
