"""A plan whose speed screen compares with `dense`, not `single`: every figure the projection, the
preflight's go/no-go, the study machine's re-projection and the verdict print is over dense, from
seconds worked out by hand (`gradshare.contract.speed` is the one place the ratio and the pass are
decided). A slip back to "over single" anywhere changes a figure below."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gradshare.contract import speed
from gradshare.contract.plan import load_plan
from gradshare.cost import link as ML
from gradshare.cost import measured
from gradshare.cost import projection as P
from tests.unit.cost.test_projection import OVERHEAD, _calibration, _record
from tests.unit.cost.test_share import studied

DENSE = {"screen.speed_baseline": "dense", "schedule.updates": "128"}


def test_the_one_function_divides_by_the_baseline_and_passes_at_the_threshold_itself():
    plan = load_plan("tiny", {"screen.speed_baseline": "dense", "screen.speed_ratio": "1.25"})
    s = speed.screen(plan, {"single": 100.0, "dense": 80.0, "powersgd": 100.0})
    assert (s.arm, s.baseline, s.ratio, s.passes) == ("powersgd", "dense", 1.25, True)  # >=, not >
    assert not speed.screen(plan, {"dense": 80.0, "powersgd": 99.9}).passes
    assert speed.screen(plan, {"dense": 80.0, "single": 100.0}, arm="single").ratio == pytest.approx(1.25)


def test_the_projection_of_the_study_hosts_is_over_dense_in_every_row_and_sentence():
    plan = load_plan("full", DENSE)
    h = P.Hosts(plan, _record(n_updates=16), _calibration(), "by hand")
    h.cost = _calibration()
    link = plan.infra.link_gbit * 1e9
    single = 4096 * 20e-6 + 2 * 0.005 + 0.02
    rank = 2048 * 20e-6 + 0.005 + 0.02
    dense_t = rank + 0.01 + h.dense_bytes * OVERHEAD * 8 / link
    psgd_t = rank + 0.01 + 0.03 + 2 * 6e9 / 100e9 + h.compressed_bytes * OVERHEAD * 8 / link
    warm = plan.powersgd.warmup_updates
    psgd_s, dense_s = warm * dense_t + (16 - warm) * psgd_t, 16 * dense_t
    rows = {r["arm"]: r for r in h.table()}
    # two ranks train 2 x 16 updates' tokens in each arm's seconds; single one rank's in its own
    assert rows["dense"]["speed_ratio"] == pytest.approx(1.0)
    assert rows["powersgd"]["speed_ratio"] == pytest.approx(dense_s / psgd_s)
    assert rows["single"]["speed_ratio"] == pytest.approx(dense_s / (16 * single))
    assert rows["powersgd"]["speed_screen_passes"] is (dense_s / psgd_s >= plan.screen.speed_ratio)
    assert rows["powersgd"]["cheaper_than_baseline"] is (2 * psgd_s < 2 * dense_s)
    assert h.ratio("powersgd", 2, link / 1e6) == pytest.approx(dense_s / psgd_s)

    p = P.compute(plan, _record(n_updates=16), "by hand", replace(_calibration(), checks={"w": {"error": 0.01}}))
    md = P.markdown(p)
    assert "| arm | s/update | speed ratio vs dense | GPU-s | cheaper than dense |" in md
    first = P.verdict_lines(p)[0]
    ratio = next(r for r in p["rows"] if r["arm"] == "powersgd")["speed_ratio"]
    assert first.startswith(f"powersgd on the plan's hosts: speed ratio {ratio:.2f} over dense")
    assert "than dense" in first and "single" not in first
    # dense is its own baseline: a ratio of 1 at every host count and link
    assert {round(c["speed_ratio"], 9) for c in p["curves"] if c["arm"] == "dense"} == {1.0}


def test_the_preflight_go_no_go_is_over_dense():
    plan = load_plan("tiny", {"screen.speed_baseline": "dense", "powersgd.warmup_updates": "2"})
    n, warm, c = plan.schedule.updates, 2, 1.0
    figures = {"best": "s1", "settings": {"s1": {"dense_round_bytes": 1e6, "dense_first_Bps": 2e6,
                                                 "dense_last_Bps": 1e6, "powersgd_round_s": 0.1}}}
    g = measured.go_no_go(plan, figures, studied(plan, c, [(4, 4)]), 0.0, 0.0, 0.0)
    for rate, dense_round in (("first", 0.5), ("last", 1.0)):
        dense_s = n * (c / 2 + dense_round)
        psgd_s = warm * (c / 2 + dense_round) + (n - warm) * (c / 2 + 0.1)
        assert g["speed_ratio"][rate] == pytest.approx(dense_s / psgd_s)  # over dense's seconds, not single's n x c
    assert g["speed_arms"] == ["powersgd", "dense"]
    per_update = {"single": 1.0, "dense": 0.8, "powersgd": 0.5}  # the GPU projection's, where given
    g = measured.go_no_go(plan, figures | {"per_update": per_update}, studied(plan, c, [(4, 4)]), 0.0, 0.0, 0.0)
    assert g["speed_ratio"]["first"] == g["speed_ratio"]["last"] == pytest.approx(0.8 / 0.5)
    assert g["speed_ratio"]["verdict"] == ("pass" if 0.8 / 0.5 >= plan.screen.speed_ratio else "fail")


def test_the_study_machine_re_projected_is_over_dense():
    plan = load_plan("tiny", {"screen.speed_baseline": "dense"})
    m = ML.Machine(name="m", single_s=1.0, tokens_per_update=1000, usd_per_host_hour=3.6,
                   cross_zone_usd_per_gb=0.01, link_mbit=8.0,
                   arms={"dense": ML.ArmInputs(0.1, 1e6), "powersgd": ML.ArmInputs(0.2, 1e5)})
    rows = {(r["arm"], r["hosts"], r["rate_mbit"]): r for r in ML.grid(m, plan, hosts=(2,), rates_mbit=[8.0])}
    d, p = rows[("dense", 2, 8.0)], rows[("powersgd", 2, 8.0)]
    assert d["speed_ratio"] == pytest.approx(1.0)
    assert p["speed_ratio"] == pytest.approx(d["s_per_update"] / p["s_per_update"])
    # single (one update a second) against dense on the plan's two hosts over this machine's link
    assert rows[("single", 1, math.inf)]["speed_ratio"] == pytest.approx(d["s_per_update"] / 1.0)
    assert "speed ratio vs dense" in ML.table(list(rows.values()), plan.screen.speed_baseline)
