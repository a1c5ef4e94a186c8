"""The deadline and the budget checks (`gradshare.cost.limits`) on figures written here: the
update that would pass the deadline or the bound is not started. (Arms refused or stopped by
them for real: tests/e2e/test_limits.py.)"""
from __future__ import annotations

import pytest

from gradshare.cost import limits as L
from gradshare.contract import metrics as M
from gradshare.contract.plan import load_plan


def _limits(**kw) -> L.Limits:
    base = dict(start_epoch=1000.0, deadline_epoch=1000.0 + 3600, budget_usd=10.0, spent_before_usd=2.0,
                usd_per_s=0.001, cross_usd_per_byte=0.01 / 1e9, arm_start_epoch=2000.0, updates=128)
    return L.Limits(**{**base, **kw})


def test_the_check_stops_before_an_update_that_would_pass_the_deadline():
    lim = _limits()
    assert lim.check(10, now=4500.0, next_s=99.0, cross_bytes=0) is None  # ends at 4599 < 4600
    kind, reason = lim.check(10, now=4500.0, next_s=101.0, cross_bytes=0)
    assert kind == "deadline" and reason.startswith("deadline:") and "stopped after update 10 of 128" in reason
    assert lim.check(128, now=4599.0, next_s=500.0, cross_bytes=0) is None  # nothing left to start



def test_the_check_counts_host_seconds_and_cross_zone_bytes_against_the_bound():
    lim = _limits(deadline_epoch=1e9)
    # $2 before + 6000 s x $0.001 = $8; + 150 GB x $0.01 = $1.5 -> $9.5; next 1 s: $9.501 <= 10
    assert lim.spend(8000.0, 150e9) == pytest.approx(9.5)
    assert lim.check(5, now=8000.0, next_s=1.0, cross_bytes=150e9) is None
    kind, reason = lim.check(5, now=8000.0, next_s=1.0, cross_bytes=150e9, next_cross_bytes=60e9)
    assert kind == "budget" and "$10 bound" in reason and "$9.5000" in reason
    assert lim.step_metrics(8000.0, 150e9) == {M.SPEND_USD: pytest.approx(9.5), M.STUDY_HOURS: pytest.approx(7000 / 3600)}



def test_expected_cross_zone_bytes_follow_the_ring_and_the_warm_up():
    from gradshare.model.source import parameter_shapes
    from gradshare.cost.volume import WIRE_OVERHEAD
    from gradshare.kinds.base import gradient_elements

    plan = load_plan("tiny", {})
    shapes = parameter_shapes(plan)
    dense = 4 * gradient_elements(shapes)
    assert dense == 4 * sum(int(__import__("math").prod(s)) for s in shapes)
    # two hosts: each sends and receives the logical volume once per update
    assert L.expected_cross_bytes(plan, "dense") == pytest.approx(128 * dense * WIRE_OVERHEAD * 4)
    assert L.expected_cross_bytes(plan, "single") == 0
    psgd = L.expected_cross_bytes(plan, "powersgd")
    assert L.expected_cross_bytes(plan, "dense") / 20 < psgd < L.expected_cross_bytes(plan, "dense")


def test_past_spend_bills_each_hosts_sent_and_received_cross_zone_bytes(mlflow_server):
    """`spent` prices a finished attempt read from the store as the budget check does: its hosts over its
    wall time, plus every byte each host sent and received across the zones, each direction billed
    (figures of different powers of two, so that any direction or host left out shows)."""
    from gradshare.contract.tags import ARM, ATTEMPT, STEP
    from gradshare.cost.accounting import host_price
    from gradshare.tracking import connection, figures

    plan = load_plan("tiny", {})
    assert L.crosses_zones(plan, "dense") and not L.crosses_zones(plan, "single")
    c, study = connection.client(), "spend-both-directions"
    exp = c.create_experiment(study)
    start_ms, hour_ms = 1_700_000_000_000, 3_600_000
    wire = {M.host_wire_tx_total(0): 1e9, M.host_wire_rx_total(0): 2e9,
            M.host_wire_tx_total(1): 4e9, M.host_wire_rx_total(1): 8e9}
    for arm in ("dense", "single"):
        run = c.create_run(exp, start_time=start_ms, tags={STEP: "train", ARM: arm, ATTEMPT: "1"})
        for key, value in wire.items():
            c.log_metric(run.info.run_id, key, value)
        c.set_terminated(run.info.run_id, "FINISHED", end_time=start_ms + hour_ms)
    dense = 2 * host_price(plan) + 15 * plan.infra.cross_zone_usd_per_gb  # two hosts 1 h, 15 GB
    single = 1 * host_price(plan)  # one host: nothing crossed a zone, whatever its counters say
    assert L.spent(plan, figures.attempts(study)) == pytest.approx(dense + single, rel=1e-12)
