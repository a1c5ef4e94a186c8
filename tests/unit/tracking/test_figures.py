"""The one reader of a study's measured figures (`gradshare.tracking.figures`), against a real tracking
server: runs made here with known figures are read back as the plain values cost computes with."""
from __future__ import annotations

import json

import pytest

from gradshare.contract import metrics as M
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ARM, ATTEMPT, REFUSAL, STEP
from gradshare.model.source import MODEL_SHAPES
from gradshare.tracking import connection
from gradshare.tracking import figures as F

START_MS = 1_700_000_000_000


def _run(c, exp: str, step: str, status: str = "FINISHED", start_ms: int = START_MS, tags: dict | None = None):
    run = c.create_run(exp, start_time=start_ms, tags={STEP: step, **(tags or {})})
    c.set_terminated(run.info.run_id, status, end_time=start_ms + 60_000)
    return c.get_run(run.info.run_id)


def _train(c, exp: str, arm: str, step_s: list[float], status: str = "FINISHED", start_ms: int = START_MS,
           attempt: str = "1"):
    run = c.create_run(exp, start_time=start_ms, tags={STEP: "train", ARM: arm, ATTEMPT: attempt})
    rid = run.info.run_id
    for update, s in enumerate(step_s, start=1):
        c.log_metric(rid, M.STEP_S, s, step=update)
        c.log_metric(rid, M.LOGICAL_BYTES, 1000.0 * update, step=update)
    c.log_metric(rid, M.WALL_S, 50.0)
    c.log_param(rid, "link_rate_mbit", "inf")
    c.set_terminated(rid, status, end_time=start_ms + 60_000)
    return rid


@pytest.fixture(scope="module")
def study(mlflow_server):
    """A study made by hand: a prepare run (its start and model shapes recorded), single finished
    twice (0.2 s, then 0.4 s an update), dense failed, a refused and an unclaimed powersgd record,
    and two finished preflights."""
    c, name = connection.client(), "figures-read-back"
    exp = c.create_experiment(name)
    prep = c.create_run(exp, start_time=START_MS, tags={STEP: "prepare"})
    c.log_param(prep.info.run_id, F.START_PARAM, "1700000123.5")
    c.log_text(prep.info.run_id, json.dumps({"shapes": [[8, 4], [4]]}), MODEL_SHAPES)
    c.set_terminated(prep.info.run_id, "FINISHED")
    ids = {"single_old": _train(c, exp, "single", [0.1, 0.2, 0.3]),
           "single_new": _train(c, exp, "single", [0.4, 0.4], start_ms=START_MS + 1, attempt="2"),
           "dense": _train(c, exp, "dense", [9.0], status="FAILED")}
    _run(c, exp, "train", "FAILED", tags={ARM: "powersgd", ATTEMPT: "1", REFUSAL: "true"})  # never held a host
    _run(c, exp, "train", "FAILED", tags={ARM: "powersgd"})  # a record without an attempt: no workers started
    for i, best in enumerate(("1x1", "4x1")):
        pre = _run(c, exp, "preflight", start_ms=START_MS + i)
        c.log_text(pre.info.run_id, json.dumps({"best": best}), F.PREFLIGHT_FILE)
        ids[f"preflight{i}"] = pre.info.run_id
    return name, c.get_run(prep.info.run_id), ids


def test_the_reader_gathers_the_studys_figures_as_plain_values(study):
    name, prep, ids = study
    plan = load_plan("tiny", {})
    known = F.read(name, prep, plan)
    assert known.start_epoch == 1700000123.5  # prepare's recorded start, not its run's
    assert known.shapes == ((8, 4), (4,))  # as recorded, not built
    # every arm of the plan, its FINISHED runs oldest first, each with its updates' seconds
    assert set(known.finished) == set(plan.arms.names) and known.done == {"single"}
    old, new = known.finished["single"]
    assert (old.run_id, old.step_s, old.median_step_s) == (ids["single_old"], ((1, 0.1), (2, 0.2), (3, 0.3)), 0.2)
    assert (new.run_id, new.median_step_s, new.metrics[M.WALL_S]) == (ids["single_new"], 0.4, 50.0)
    # the attempts that held hosts, whatever their status: not the refusal, not the unclaimed record
    assert sorted(r.info.run_id for r in known.attempts) == sorted([ids["single_old"], ids["single_new"], ids["dense"]])
    # the first finished preflight, as the limits have always read it (`study_runs.search`: oldest first)
    assert known.preflight == {"best": "1x1", "run_id": ids["preflight0"]}


def test_a_study_before_its_start_was_recorded_starts_with_its_prepare_run(study):
    _, prep, _ = study
    older = type(prep)(prep.info, type(prep.data)(metrics=[], params=[], tags=[]))
    assert F.study_start(older) == START_MS / 1000


def test_the_machine_is_fitted_on_each_arms_newest_finished_run(study):
    name, _, ids = study
    arms = F.link_arms(name, load_plan("tiny", {}))
    assert list(arms) == ["single"]  # dense failed: not a measurement of the machine
    assert arms["single"] == {"step_s": [(1, 0.4), (2, 0.4)], "tokens_per_s": [],
                              "logical_bytes": [(1, 1000.0), (2, 2000.0)], "link_rate_mbit": "inf"}


def test_only_a_full_profile_study_has_its_recorded_workload_read(study):
    _, prep, _ = study
    assert F.study_workload(prep, load_plan("tiny", {})) is None  # a tiny schedule is not the hosts'
    assert F.study_workload(prep, load_plan("full", {})) is None  # prepared before it was recorded
    assert F.study_workload(None, load_plan("full", {})) is None  # no study
