"""The deadline and the budget, enforced: an arm that would pass either is refused with the
figures; an arm that reaches either stops after a whole update, FAILED `deadline`/`budget`;
the arms after it are recorded unavailable for the same reason; spend is logged per update.
(The checks on figures written by hand: tests/unit/cost/test_limit_checks.py.)"""
from __future__ import annotations

import time

import pytest

from gradshare.cost import limits as L
from gradshare.contract import metrics as M
from gradshare.contract.tags import ATTEMPT, FAILURE, REFUSAL
from gradshare.tracking import connection
from gradshare.tracking import figures as study_figures
from gradshare.tracking import study_runs
from tests.conftest import overrides, run_entry

pytestmark = pytest.mark.e2e

# Plan figures that let the pre-arm projection through (a fast expected update) on SMALL.
FAST = {"arms.expected_update_s": "0.01", "arms.expected_startup_s": "1"}
# Prepare (~12 s) and the arm's start (~12 s on 2 idle cores) leave the single arm about twenty-four
# 4 s updates of its 40 (160 s). The margin is for load, not for speed: with both taking four times
# as long (~96 s) six updates still run before the deadline, and on no machine do all 40.
DEADLINE_S = 120
SLOW_S = 4


def test_an_arm_projected_past_the_bound_is_refused_with_the_figures(mlflow_server):
    study = "budget-refused"
    run_entry("prepare", "--study", study, *overrides({"infra.budget_usd": "0.00001", "model.pretrain_steps": "1"}))
    proc = run_entry("train", "--study", study, "--arm", "single", check=False)
    assert proc.returncode != 0
    [run] = study_runs.search(study, "train", "single")
    reason = run.data.tags[FAILURE]
    assert run.data.tags[REFUSAL] == "true" and ATTEMPT not in run.data.tags  # no attempt spent
    assert reason.startswith("budget: arm single would cost $") and "past the $1e-05 bound" in reason
    assert "arms.expected_update_s" in reason  # where the projection came from


@pytest.fixture(scope="module")
def stopped_study(mlflow_server):
    """A deadline some updates into the single arm: DEADLINE_S after prepare starts, updates
    slowed to SLOW_S each (a fault switch), 40 of them."""
    study = "deadline-study"
    extra = {**FAST, "infra.deadline_hours": f"{DEADLINE_S / 3600:.8f}", "data.train_per_family": "76",
             "schedule.updates": "40", "model.pretrain_steps": "1"}  # 4 x 76 + 16 = 320 = 40 x 8
    run_entry("prepare", "--study", study, *overrides(extra))
    t0 = time.time()
    run_entry("train", "--study", study, "--arm", "single", check=False, env={"GRADSHARE_INJECT_SLOW_S": str(SLOW_S)})
    later = {arm: run_entry("train", "--study", study, "--arm", arm, check=False) for arm in ("dense", "powersgd")}
    run_entry("commit", "--study", study)
    return study, time.time() - t0, later


def test_an_arm_reaching_the_deadline_stops_after_a_whole_update(stopped_study):
    study, _, _ = stopped_study
    [prep] = study_runs.search(study, "prepare")
    deadline = float(prep.data.params[study_figures.START_PARAM]) + DEADLINE_S
    [run] = study_runs.search(study, "train", "single")
    assert run.info.status == "FAILED"
    reason = run.data.tags[FAILURE]
    assert reason.startswith("deadline: the next update"), reason
    steps = [m.step for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S)]
    assert steps == list(range(1, len(steps) + 1)) and 0 < len(steps) < 40
    assert f"stopped after update {len(steps)} of 40" in reason
    # no update was started that the check projected past the deadline: the last one ended before
    # it, or past it by no more than its own seconds ran over the one before (SLOW_S covers that);
    # then the stop's own seconds (the workers' exit, the record): a bound for a hang, not a speed
    last = max(m.timestamp for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S)) / 1000
    assert last <= deadline + SLOW_S, (last, deadline)
    assert run.info.end_time / 1000 <= deadline + 120
    spend = connection.client().get_metric_history(run.info.run_id, M.SPEND_USD)
    assert [m.step for m in spend] == steps and spend[-1].value > spend[0].value > 0


def test_the_arms_after_it_are_unavailable_for_the_same_reason(stopped_study):
    from gradshare.tracking import store
    study, _, later = stopped_study
    _, commitment = store.commitment(study)
    arms = {a["arm"]: a for a in commitment["arms"]}
    assert arms["single"]["status"] == "FAILED" and arms["single"]["failure_reason"].startswith("deadline:")
    for arm in ("dense", "powersgd"):
        assert later[arm].returncode != 0
        assert arms[arm]["status"] == "FAILED"
        assert "unavailable" in arms[arm]["failure_reason"] and "refused: deadline: arm" in arms[arm]["failure_reason"]


def test_the_budget_check_reads_the_model_shapes_prepare_recorded(stopped_study):
    """Each arm's check reads prepare's `model_shapes.json` instead of loading transformers to
    build the model again; a study without the record (an older one) has them built."""
    from types import SimpleNamespace

    from gradshare.tracking import store
    from gradshare.model.source import parameter_shapes

    study, _, _ = stopped_study
    prep, plan = store.prepared_plan(study)
    built = parameter_shapes(plan)
    assert study_figures.prepared_shapes(prep, plan) == built and len(built) > 10
    [commit] = study_runs.search(study, "commit")  # a run with no such record
    assert study_figures.prepared_shapes(SimpleNamespace(info=commit.info), plan) == built
    assert L.expected_cross_bytes(plan, "dense", built) == L.expected_cross_bytes(plan, "dense")


def test_an_arms_projection_reads_the_start_up_measured_on_the_studys_finished_arms(trained_study, partial_study):
    """With an arm of as many processes finished, its measured rate and start-up; with only an
    arm of another size (single, in the partial study), the plan's update seconds and that arm's
    measured start-up (wall less updates, plus launch and upload), never the declared figure."""
    from gradshare.tracking import store
    prep, plan = store.prepared_plan(trained_study)
    [dense] = study_runs.search(trained_study, "train", "dense", status="FINISHED")
    got = L.expected_arm(plan, "dense", study_figures.read(trained_study, prep, plan))
    m = dense.data.metrics
    assert got["source"] == "measured on arm dense"
    assert got["startup_s"] == pytest.approx(m[M.WALL_S] - m[M.ACTIVE_S] + m[M.phase_s("launch")]
                                             + m[M.phase_s("checkpoint_upload")])
    study, _ = partial_study
    prep, plan = store.prepared_plan(study)
    [single] = study_runs.search(study, "train", "single", status="FINISHED")
    s = single.data.metrics
    got = L.expected_arm(plan, "powersgd", study_figures.read(study, prep, plan))
    assert got["source"] == ("the plan's arms.expected_update_s; start-up and checkpoint measured on arm single")
    assert got["update_s"] == plan.arms.expected_update_s
    assert got["startup_s"] == pytest.approx(s[M.WALL_S] - s[M.ACTIVE_S] + s[M.phase_s("launch")]
                                             + s[M.phase_s("checkpoint_upload")])
    assert got["startup_s"] != plan.arms.expected_startup_s
