"""`gradshare preflight` on two emulated hosts (network namespaces) whose link caps each TCP flow
and the whole together, as a cloud network does between instances in two zones:

- the preflight reports both caps: one socket's flow below the several sockets' total;
- the arms use the fastest setting it measured (`hardware.sockets=auto`), recorded on their runs,
  and the dense arm across the same link runs as the preflight's figures project it (the
  product's own projection, `measured.update_s`: one device's update, measured on `single`,
  times one rank's share as the preflight timed it, plus dense's round at the sustained rate),
  within the spread measured over repeated runs (`RATIO`);
- its go/no-go, both ways: a budget that the measured link cannot meet refuses the first arm
  before it starts, naming the measured figure; with the plan's $100 it says GO and the arms train;
- the socket settings reach the workers' environment (read by the worker, recorded on its run).

Skipped with the reason where namespaces cannot be made (not root, no `ip`/`tc`).
"""
from __future__ import annotations

import os
import statistics

import pytest

from gradshare.contract import metrics as M
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import FAILURE, REFUSAL, SOCKETS_BEST
from gradshare.cost import measured
from gradshare.cost.accounting import host_price
from gradshare.hosts import netns
from gradshare.steps.emulated import run_arm_across, run_preflight_across
from gradshare.tracking import connection, study_runs
from gradshare.tracking import figures as study_figures
from tests.conftest import SMALL, overrides, run_entry

pytestmark = pytest.mark.e2e

REASON = netns.unavailable()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts here: {REASON}")

TOTAL_MBIT, FLOW_MBIT = 40.0, 10.0
# 1 MB buckets: dense's exchange is several all-reduces in flight, which several sockets can carry.
# A round of them takes ~1.5 s at four flows: the last 3 s of 8 hold two rounds or more (a window of
# 1.5 s in 4, one round, once projected dense 16% slow: 2.131 s against the 1.836 s it ran)
PREFLIGHT = {"preflight.sockets": "1x1,4x1", "preflight.sustain_s": "8", "preflight.window_s": "3",
             "preflight.upload_mb": "4", "powersgd.bucket_cap_mb": "1", "model.pretrain_steps": "1"}


# got / projected, dense's median seconds an update over the product's projection, 2026-12-07, the
# 2-core machine. This test alone: 0.890, 1.010 (idle), 1.059, 1.077 (one core kept busy by `yes`),
# 1.159 (two unit-test processes beside it); in the whole suite on two workers from a clean clone
# (`CI=true bash .ci/run`): 1.248 (with `yes` beside it), 1.080 (idle). Seven runs: mean 1.075,
# sample sd 0.112. The spread is the exchange's: dense's own exchange ran 1.81-2.02 s while the
# preflight's sustained round read 1.58-2.10 s; the compute term (0.07-0.22 s) moved the ratio by a
# few percent. Mean +- 3 sd (0.74..1.41), rounded out: a projection off by more than that is a
# fault of the projection. The share itself is checked on figures that do not move:
# tests/unit/model/test_update_cost.py.
RATIO = (0.70, 1.45)


def _median_steps(run) -> float:
    return statistics.median(m.value for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))


@needs_hosts
def test_the_preflight_reports_both_caps_and_projects_the_dense_arm_within_its_measured_spread(mlflow_server):
    """Dense's measured seconds an update over the product's projection lie in RATIO, 0.70..1.45:
    the mean +- 3 sd of seven runs on 2026-12-07 (0.89-1.25; mean 1.075, sd 0.112), idle, with a
    core kept busy, and in the whole suite on two workers."""
    study = "preflight-caps"
    run_entry("prepare", "--study", study, *overrides(PREFLIGHT))
    assert run_preflight_across(study, TOTAL_MBIT, timeout_s=600, flow_mbit=FLOW_MBIT) == 0
    figures = study_figures.preflight(study)
    one, four = figures["settings"]["1x1"], figures["settings"]["4x1"]
    assert one["capacity_Bps"] * 8 / 1e6 <= FLOW_MBIT * 1.05  # one socket: one flow's cap
    assert four["capacity_Bps"] > 1.5 * one["capacity_Bps"]  # several sockets: toward the total
    assert four["capacity_Bps"] * 8 / 1e6 <= TOTAL_MBIT * 1.05
    assert figures["best"] == "4x1"
    [pre] = study_runs.search(study, "preflight")
    assert pre.info.status == "FINISHED" and pre.data.tags[SOCKETS_BEST] == "4x1"
    assert "preflight/sockets_1x1/capacity_MBps" in pre.data.metrics
    assert pre.data.tags["mlflow.note.content"].startswith("### Preflight: GO")  # $100: the arms fit it

    run_entry("train", "--study", study, "--arm", "single")  # one host: one device's update, measured
    assert run_arm_across(study, "dense", TOTAL_MBIT, timeout_s=900, flow_mbit=FLOW_MBIT)
    [dense] = study_runs.search(study, "train", "dense")
    assert dense.data.params["sockets"] == "4x1" and "preflight run" in dense.data.params["sockets_source"]
    assert dense.data.params["socket_env"] == "GLOO_SOCKET_IFNAME=gslink,gslink,gslink,gslink"
    plan = load_plan("tiny", {**SMALL, **PREFLIGHT})
    compute, _ = measured.compute_s(plan, study_figures.finished_runs(study, plan))
    projected = measured.update_s(plan, "dense", 1, compute, figures)
    got = _median_steps(dense)
    share = figures["compute"]
    round_s, _ = measured.round_s(figures, figures["best"])
    print(f"dense across the link: {got:.3f} s an update, projected {projected:.3f} s (compute {compute:.3f} s "
          f"x share {share['share']:.3f} [{share['rank_s']:.3f} / {share['alone_s']:.3f}] + round {round_s:.3f} s); "
          f"got/projected {got / projected:.3f}")
    if os.environ.get("GRADSHARE_TEST_FIGURES"):  # a file to keep the figures of repeated runs in
        with open(os.environ["GRADSHARE_TEST_FIGURES"], "a") as fh:
            fh.write(f"{got:.4f} {projected:.4f} {compute:.4f} {share['share']:.4f} {round_s:.4f}\n")
    assert RATIO[0] <= got / projected <= RATIO[1], (got, projected)


def _declared_single_usd(plan) -> float:
    """What the budget check projects for `single` with no preflight: start-up and updates at the
    plan's declared seconds, one host."""
    a = plan.arms
    return (a.expected_startup_s + plan.schedule.updates * a.expected_update_s) * host_price(plan) / 3600


@needs_hosts
def test_a_budget_the_measured_link_cannot_meet_refuses_the_first_arm_before_it_starts(mlflow_server):
    """The bound between: `single` alone fits it at the plan's declared seconds, but the remaining
    arms on the measured link (dense's exchange at 8 Mbit/s, seconds an update) do not. (The
    feasible way, a GO and the arms then trained: the test above.)"""
    study = "preflight-no-go"
    extra = PREFLIGHT | {"preflight.sockets": "1x1", "preflight.sustain_s": "1", "preflight.window_s": "1"}
    plan = load_plan("tiny", {**SMALL, **extra})
    budget = 3 * _declared_single_usd(plan)
    run_entry("prepare", "--study", study, *overrides(extra | {"infra.budget_usd": f"{budget:.8f}"}))
    assert run_preflight_across(study, 8.0, timeout_s=600, flow_mbit=8.0) == 3  # the step's no-go
    assert run_entry("train", "--study", study, "--arm", "single", check=False).returncode != 0
    [run] = study_runs.search(study, "train", "single")
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true"
    reason = run.data.tags[FAILURE]
    assert reason.startswith("budget: the study's remaining arms") and "preflight run" in reason, reason
    assert "Gbit/s each way with sockets 1x1" in reason and "past the $" in reason
