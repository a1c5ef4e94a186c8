"""Read a study from the MLflow tracking API: never from local paths.

Everything comes through `search_runs` filtered on the study's tags and artifacts
downloaded through the client: the plan (prepare run), each arm's train run
(status, reason, summary metrics and per-step histories), the commitment, and each
model's per-case scores.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gradshare.contract import metrics as M
from gradshare.contract.errors import StudyError
from gradshare.contract.tags import ARM, FAILURE, REFUSAL
from gradshare.tracking import connection, store, study_runs
from gradshare.util.jsonio import read_jsonl


@dataclass
class ArmRecord:
    arm: str
    status: str  # FINISHED, FAILED, or UNAVAILABLE (not committed/never run)
    run_id: str | None = None
    failure_reason: str | None = None
    metrics: dict = field(default_factory=dict)
    histories: dict = field(default_factory=dict)  # per-update metric (M.PER_UPDATE) -> [(step, value)]
    hosts: list = field(default_factory=list)
    # the arm's attempts, oldest first: {"attempt", "run_id", "status", "failure_reason"}
    attempts: list = field(default_factory=list)
    params: dict = field(default_factory=dict)  # the train run's parameters (link, launch, ...)


@dataclass
class StudyRecord:
    study: str
    plan: object
    prepare_run_id: str
    commitment: dict | None
    arms: dict[str, ArmRecord]
    scores: dict[str, dict]  # model -> {"run_id", "test": [...], "retention": [...], "metrics": {...}}


def collect(study: str) -> StudyRecord:
    prep, plan = store.prepared_plan(study)
    try:
        _, commitment = store.commitment(study)
    except StudyError:
        commitment = None
    c = connection.client()
    tmp = Path(tempfile.mkdtemp(prefix="gradshare-analysis-"))
    arms = {}
    committed = {e["arm"]: e for e in (commitment or {}).get("arms", [])}
    for arm in plan.arms.names:
        entry = committed.get(arm)
        if entry is None:
            arms[arm] = _arm_without_commitment(study, arm)
            continue
        run = c.get_run(entry["run_id"])
        rec = ArmRecord(arm, entry["status"], entry["run_id"], entry.get("failure_reason"),
                        dict(run.data.metrics), attempts=attempts_of(entry), params=dict(run.data.params))
        if entry["status"] == "FINISHED":
            rec.histories = histories(c, entry["run_id"])
            summary = json.loads(study_runs.download(entry["run_id"], "train_summary.json", tmp / arm).read_text())
            rec.hosts = summary["hosts"]
        arms[arm] = rec
    scores = {}
    parents = [r.info.run_id for r in study_runs.finished_score_steps(study)]
    if commitment and parents:
        for run in study_runs.search(study, "score", status="FINISHED"):
            model = run.data.tags.get(ARM)
            # only the scores of the one finished score step, never a failed attempt's
            if model is None or model in scores or run.data.tags.get("mlflow.parentRunId") != parents[0]:
                continue
            d = tmp / f"score-{model}"
            scores[model] = {
                "run_id": run.info.run_id, "metrics": dict(run.data.metrics),
                "test": read_jsonl(study_runs.download(run.info.run_id, "per_case/test.jsonl", d)),
                "retention": read_jsonl(study_runs.download(run.info.run_id, "per_case/retention.jsonl", d))}
    return StudyRecord(study, plan, prep.info.run_id, commitment, arms, scores)


def histories(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every per-update metric's history of a train run, by update: an entry the run never logged
    (a study trained before the entry was added) reads as an empty history."""
    return {m.name: sorted((h.step, h.value) for h in client.get_metric_history(run_id, m.name))
            for m in M.PER_UPDATE}


def attempts_of(entry: dict) -> list[dict]:
    """The attempts a commitment entry lists; an entry without the list (a commitment made
    before attempts were recorded) stands for one attempt, itself."""
    if "attempts" in entry:
        return [dict(a) for a in entry["attempts"]]
    return [{"attempt": 1, "run_id": entry["run_id"], "status": entry["status"],
             "failure_reason": entry.get("failure_reason")}]


def _arm_without_commitment(study: str, arm: str) -> ArmRecord:
    # A refused start did nothing and is no attempt: it never stands for the arm.
    runs = [r for r in study_runs.search(study, "train", arm) if r.data.tags.get(REFUSAL) != "true"]
    if not runs:
        return ArmRecord(arm, "UNAVAILABLE", failure_reason="never trained, and the study is not committed")
    last = runs[-1]
    rec = ArmRecord(arm, "UNAVAILABLE" if last.info.status != "FAILED" else "FAILED", last.info.run_id,
                    last.data.tags.get(FAILURE) or "the study is not committed: no verdict is possible",
                    dict(last.data.metrics))
    # Uncommitted: no sealed list of attempts, only the run this record describes.
    rec.attempts = [{"attempt": None, "run_id": last.info.run_id, "status": last.info.status,
                     "failure_reason": last.data.tags.get(FAILURE)}]
    return rec
