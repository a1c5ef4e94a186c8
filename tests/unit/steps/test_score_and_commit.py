"""`steps/score` and `steps/commit` without a whole study: the slips a study would hide until its
verdicts were wrong. Score makes each arm's model from that arm's own checkpoint (a late-bound
path would score every arm with the last one's weights). Commit seals, per arm, the FINISHED
attempt with its weights hash, else the last attempt's reason, else one unavailable run; every
attempt listed, an interrupted one too. (A whole study committed and scored: tests/e2e/.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ATTEMPT, CKPT_SHA, FAILURE, INTERRUPTED
from gradshare.steps import commit, score
from gradshare.tracking import claims, connection, study_runs
from tests.conftest import SMALL

PLAN = load_plan("tiny", SMALL)


def test_each_arm_is_scored_from_its_own_checkpoint_and_the_seed_from_the_inputs(monkeypatch):
    loaded = []
    monkeypatch.setattr(score, "load_for_scoring", lambda path, plan, device: loaded.append(path) or path)
    monkeypatch.setattr(score, "seed_model", lambda plan, inputs, device: pytest.fail("the seed is made only when asked"))
    ckpts = {"single": Path("/c/single"), "dense": Path("/c/dense"), "powersgd": Path("/c/powersgd")}
    makers = score.model_makers(PLAN, Path("/inputs"), ckpts, "cpu")
    assert list(makers) == ["seed", "single", "dense", "powersgd"]
    assert not loaded  # nothing is loaded before its turn: one model in memory at a time
    for arm in ("powersgd", "single", "dense"):
        assert makers[arm]() == ckpts[arm]
    assert loaded == [ckpts["powersgd"], ckpts["single"], ckpts["dense"]]


def _study(name: str) -> str:
    study_runs.setup(name, create=True)
    return name


def _train_run(study: str, arm: str, status: str, attempt: int, **tags) -> claims.Entry:
    import mlflow

    c = connection.client()
    exp = mlflow.get_experiment_by_name(study).experiment_id
    run = c.create_run(exp, tags=study_runs.study_tags(study, "train", PLAN.sha256(), arm)
                       | {ATTEMPT: str(attempt), **tags})
    c.set_terminated(run.info.run_id, status)
    return run.info.run_id


def _entry(index: int, arm: str, run_id: str) -> claims.Entry:
    run = connection.client().get_run(run_id)
    t = run.data.tags
    return claims.Entry(index, "train", arm, run_id, run.info.status, False, t.get(FAILURE), True,
                        t.get(INTERRUPTED) == "true")


def test_commit_seals_the_finished_attempt_else_the_last_failure_and_lists_every_attempt(mlflow_server):
    study = _study("commit-units")
    stopped = _train_run(study, "dense", "KILLED", 1, **{FAILURE: "interrupted: stopped by signal SIGTERM",
                                                         INTERRUPTED: "true"})
    first = _train_run(study, "dense", "FAILED", 2, **{FAILURE: "training diverged: loss is nan at update 3"})
    done = _train_run(study, "dense", "FINISHED", 3, **{CKPT_SHA: "a" * 64})
    prefix = [_entry(1, "dense", stopped), _entry(2, "dense", first), _entry(3, "dense", done)]
    sealed = commit.arm_entry(study, "dense", PLAN.sha256(), prefix)
    assert sealed["status"] == "FINISHED" and sealed["run_id"] == done and sealed["checkpoint_sha256"] == "a" * 64
    assert [(a["attempt"], a["run_id"], a["status"]) for a in sealed["attempts"]] == [
        (1, stopped, "KILLED"), (2, first, "FAILED"), (3, done, "FINISHED")]
    # two failures: the last one's reason is the arm's
    again = _train_run(study, "single", "FAILED", 1, **{FAILURE: "stalled: first"})
    last = _train_run(study, "single", "FAILED", 2, **{FAILURE: "deadline: second"})
    failed = commit.arm_entry(study, "single", PLAN.sha256(), [_entry(4, "single", again), _entry(5, "single", last)])
    assert failed["status"] == "FAILED" and failed["run_id"] == last and failed["failure_reason"] == "deadline: second"


def test_an_arm_never_attempted_gets_one_unavailable_run_however_often_it_is_committed(mlflow_server):
    study = _study("commit-unavailable")
    refused = claims.Entry(1, "train", "powersgd", "r-refused", "KILLED", True, "budget: past the bound", False)
    one = commit.arm_entry(study, "powersgd", PLAN.sha256(), [refused])
    assert one["status"] == "FAILED" and one["attempts"] == []
    assert one["failure_reason"] == ("arm powersgd was never started before commit: unavailable (its last start was "
                                     "refused: budget: past the bound)")
    two = commit.arm_entry(study, "powersgd", PLAN.sha256(), [refused])
    assert two["run_id"] == one["run_id"]
    [run] = study_runs.search(study, "train", "powersgd")
    assert run.info.status == "FAILED" and run.data.tags[FAILURE] == one["failure_reason"]
