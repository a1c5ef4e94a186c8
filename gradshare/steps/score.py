"""The score step: refuse unless committed, verify every committed byte, claim, then score.

The score is claimed in the study's ledger (`gradshare.tracking.claims`): of two scores at once
exactly one proceeds; the other refuses naming it.

One parent score run for the study, and one nested score run per model (`seed`
and each committed FINISHED arm) carrying `per_case/test.jsonl`,
`per_case/retention.jsonl`, accuracy by family and overall, mean retention NLL and
scoring seconds. Arms that failed are in the commitment with their reason and are
not scored.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from gradshare.contract import metrics as M
from gradshare.contract.errors import StudyError
from gradshare.contract.tags import COMMIT_RUN, PLAN_SHA
from gradshare.data.tokenizer import load_tokenizer
from gradshare.model.evaluate import (
    device_for,
    load_for_scoring,
    score_retention,
    score_test,
    scoring_dtype,
    summarise,
)
from gradshare.model.lm import seed_model
from gradshare.tracking import claims, store, study_runs
from gradshare.tracking.orphans import process_tags
from gradshare.util.jsonio import read_jsonl


def score_study(study: str, parent_run) -> dict:
    import mlflow

    prep, plan = store.prepared_plan(study)
    commit_run, commitment = store.commitment(study)
    mlflow.set_tags({PLAN_SHA: plan.sha256(), COMMIT_RUN: commit_run.info.run_id})
    if commitment["plan_sha256"] != plan.sha256():
        raise StudyError("the commitment belongs to another plan than the prepare run's")
    tmp = Path(tempfile.mkdtemp(prefix="gradshare-score-"))
    try:
        inputs = store.verified_inputs(prep, plan, tmp, store.SCORE_INPUTS)
        ckpts = store.verified_checkpoints(commitment, tmp / "checkpoints")  # every hash before any score
        # Checked before the claim, so that a moved byte is reported even on a scored study.
        index = claims.append(prep.info.run_id, "score", None, parent_run.info.run_id)
        claims.decide_score(claims.entries(prep.info.run_id, before=index))
        tokenizer = load_tokenizer(inputs / "tokenizer")
        cases = read_jsonl(inputs / "eval/test_tasks.jsonl")
        probes = read_jsonl(inputs / "eval/probes.jsonl")
        device = device_for(plan)
        models = model_makers(plan, inputs, ckpts, device)
        results = {}
        for name, make in models.items():
            t0 = time.perf_counter()
            model = make()
            load_s = time.perf_counter() - t0
            results[name] = _score_one(study, plan, name, model, tokenizer, cases, probes, device, load_s)
            del model
        for entry in commitment["arms"]:
            if entry["status"] != "FINISHED":
                print(f"[gradshare] arm {entry['arm']} not scored: {entry['failure_reason']}")
        mlflow.log_dict({"scored": sorted(results), "not_scored": {
            e["arm"]: e["failure_reason"] for e in commitment["arms"] if e["status"] != "FINISHED"}},
            "scored.json")
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_makers(plan, inputs: Path, ckpts: dict[str, Path], device) -> dict:
    """What is scored, by name, each made only when its turn comes (one model in memory at a
    time): `seed`, the weights train started from, in the dtype the arms are scored in; then each
    committed arm from its own verified checkpoint."""
    models = {"seed": lambda: seed_model(plan, inputs, device).to(scoring_dtype(plan))}
    for arm, path in ckpts.items():
        models[arm] = (lambda p=path: load_for_scoring(p, plan, device))  # bound now: this arm's own path
    return models


def _score_one(study, plan, name, model, tokenizer, cases, probes, device, load_s: float) -> dict:
    import mlflow

    print(f"[gradshare] scoring {name} on {len(cases)} test cases and {len(probes)} probes")
    with mlflow.start_run(nested=True, run_name=f"score-{name}") as run:
        mlflow.set_tags(study_runs.study_tags(study, "score", plan.sha256(), name) | process_tags())
        t0 = time.perf_counter()
        test_rows = score_test(model, tokenizer, cases, plan, device)
        test_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        ret_rows = score_retention(model, tokenizer, probes, plan, device)
        ret_s = time.perf_counter() - t1
        metrics = summarise(test_rows, ret_rows) | {M.SCORE_TEST_S: test_s, M.SCORE_RETENTION_S: ret_s,
                                                    M.SCORE_LOAD_S: load_s}
        mlflow.log_metrics(metrics)
        mlflow.log_text("".join(_line(r) for r in test_rows), "per_case/test.jsonl")
        mlflow.log_text("".join(_line(r) for r in ret_rows), "per_case/retention.jsonl")
        print(f"[gradshare] {name}: accuracy {metrics[M.ACCURACY_OVERALL]:.3f}, retention NLL "
              f"{metrics[M.RETENTION_NLL_NATS]:.4f} nats, {load_s:.1f}s load + {test_s:.1f}s test + {ret_s:.1f}s probes")
        return {"run_id": run.info.run_id, **metrics}


def _line(row: dict) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n"
