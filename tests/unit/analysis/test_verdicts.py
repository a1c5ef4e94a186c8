"""The screens and the cost, decided on fabricated per-case data with known answers."""
import math
from dataclasses import replace

import pytest

from analysis.collect import ArmRecord, StudyRecord
from analysis.verdicts import compute
from gradshare.cost.accounting import arm_cost, cost_words
from gradshare.contract.plan import load_plan

PLAN = load_plan()
N = 100


def _cases(n_correct: int, skip: int = 0) -> list[dict]:
    """n_correct cases right, the first `skip` cases wrong before them (so that paired changes vary)."""
    return [{"case_id": f"c{i:03d}", "family": "boolean_expressions", "correct": int(skip <= i < skip + n_correct)}
            for i in range(N)]


def _probes(nll: list[float]) -> list[dict]:
    return [{"probe_id": f"p{i}", "nll_nats": x, "tokens": 10} for i, x in enumerate(nll)]


def _arm(name: str, tps: float, status: str = "FINISHED", reason: str | None = None) -> ArmRecord:
    m = {"perf/active_tokens_per_s": tps, "perf/gpu_s_active": 100.0 / tps * (1 if name == "single" else 2),
         "perf/gpu_s_total": 1.0, "perf/wall_s": 3600.0, "comm/logical_bytes_total": 1e9}
    return ArmRecord(name, status, f"run-{name}", reason, m if status == "FINISHED" else {}, {}, ["h"])


def record(cand_correct=30, control_correct=30, seed_correct=10, cand_nll=None, tps=(100.0, 120.0, 150.0),
           failed=None, seed_nll=None, plan=PLAN, cand_skip=0) -> StudyRecord:
    seed_nll = seed_nll or [1.0, 1.25, 0.75, 1.5]  # binary fractions: differences are exact
    cand_nll = cand_nll or [x + 0.0 for x in seed_nll]
    arms = {"single": _arm("single", tps[0]), "dense": _arm("dense", tps[1]), "powersgd": _arm("powersgd", tps[2])}
    scores = {"seed": {"test": _cases(seed_correct), "retention": _probes(seed_nll)},
              "single": {"test": _cases(control_correct), "retention": _probes(seed_nll)},
              "dense": {"test": _cases(control_correct), "retention": _probes(seed_nll)},
              "powersgd": {"test": _cases(cand_correct, cand_skip), "retention": _probes(cand_nll)}}
    if failed:
        arms[failed] = _arm(failed, 1.0, "FAILED", "training diverged: loss is nan at update 3")
        scores.pop(failed)
    return StudyRecord("s", plan, "prep", {"arms": []}, arms, scores)


def test_a_gain_of_20_pp_with_equal_controls_passes_the_quality_screen():
    v = compute(record())
    assert v["powersgd-seed"]["mean"] == pytest.approx(0.20)
    assert v["quality_screen"]["pass"] is True


def test_a_gain_of_9_pp_fails_the_task_gain_check_only():
    v = compute(record(cand_correct=19, control_correct=19, seed_correct=10))
    checks = v["quality_screen"]["checks"]
    assert checks["task_gain"]["value_pp"] == pytest.approx(9.0) and checks["task_gain"]["pass"] is False
    assert checks["noninferior_to_single"]["pass"] is True and v["quality_screen"]["pass"] is False


def test_candidate_below_a_control_fails_noninferiority():
    # 10 fewer correct, all on cases the control got: mean -10 pp, se > 0, lower bound < -3 pp
    v = compute(record(cand_correct=30, control_correct=40))
    assert v["powersgd-single"]["lo"] * 100 < -3
    assert v["quality_screen"]["checks"]["noninferior_to_single"]["pass"] is False


def test_retention_worse_than_two_hundredths_of_a_nat_fails():
    v = compute(record(cand_nll=[1.03125, 1.28125, 0.78125, 1.53125]))  # +2^-5 everywhere: se 0
    r = v["retention_change"]["powersgd"]
    assert r["se"] == 0.0 and r["upper"] == 0.03125
    assert v["quality_screen"]["checks"]["retention"]["pass"] is False


def test_speed_screen_threshold_is_1_10_times_single():
    assert compute(record(tps=(100.0, 100.0, 111.0)))["speed_screen"]["pass"] is True
    assert compute(record(tps=(100.0, 100.0, 109.0)))["speed_screen"]["pass"] is False


# Each screen at exactly its threshold passes (the plan says "at least" and "at most"), and a hair
# past it fails: a `>=` made `>` (or `<=` made `<`) is caught here.

def test_a_task_gain_of_exactly_10_pp_passes():
    v = compute(record(cand_correct=20, control_correct=20, seed_correct=10))
    gain = v["quality_screen"]["checks"]["task_gain"]
    assert gain["value_pp"] == 10.0 == PLAN.screen.task_gain_pp and gain["pass"] is True
    assert v["quality_screen"]["pass"] is True


def test_a_retention_bound_of_exactly_two_hundredths_of_a_nat_passes():
    v = compute(record(seed_nll=[0.0] * 4, cand_nll=[0.02] * 4))  # every probe +0.02: se 0
    check = v["quality_screen"]["checks"]["retention"]
    assert check["upper_nats"] == 0.02 == PLAN.screen.retention_upper_nats and check["pass"] is True


def test_a_speed_ratio_of_exactly_1_10_passes_and_a_hair_less_fails():
    s = compute(record(tps=(100.0, 100.0, 110.0)))["speed_screen"]
    assert s["ratio"] == 1.10 == PLAN.screen.speed_ratio and s["pass"] is True
    assert compute(record(tps=(100.0, 100.0, math.nextafter(110.0, 0))))["speed_screen"]["pass"] is False


@pytest.mark.parametrize("check, field, threshold, stricter", [
    ("task_gain", "value_pp", "task_gain_pp", math.inf),
    ("retention", "upper_nats", "retention_upper_nats", -math.inf),
    ("noninferior_to_single", "lower_pp", "noninferiority_pp", math.inf),
    ("noninferior_to_dense", "lower_pp", "noninferiority_pp", math.inf),
])
def test_each_quality_check_passes_with_its_threshold_set_to_the_measured_figure_and_fails_one_ulp_past(
        check, field, threshold, stricter):
    # A gain of 12 pp whose cases vary (se > 0), a retention change that varies: figures no
    # round threshold equals, so the plan's threshold is set to exactly what was measured.
    kw = dict(cand_correct=24, control_correct=20, seed_correct=10, cand_skip=8,
              cand_nll=[1.03125, 1.25, 0.75, 1.5])
    measured = compute(record(**kw))["quality_screen"]["checks"][check][field]
    assert measured not in (0.0, getattr(PLAN.screen, threshold))
    for value, passes in ((measured, True), (math.nextafter(measured, stricter), False)):
        plan = replace(PLAN, screen=replace(PLAN.screen, **{threshold: value}))
        got = compute(record(plan=plan, **kw))["quality_screen"]["checks"][check]
        assert got[field] == measured and got["pass"] is passes, (check, value)


def test_the_speed_screen_passes_with_its_threshold_set_to_the_measured_ratio_and_fails_one_ulp_above():
    tps = (100.0, 100.0, 113.7)
    ratio = compute(record(tps=tps))["speed_screen"]["ratio"]
    for value, passes in ((ratio, True), (math.nextafter(ratio, math.inf), False)):
        plan = replace(PLAN, screen=replace(PLAN.screen, speed_ratio=value))
        assert compute(record(tps=tps, plan=plan))["speed_screen"]["pass"] is passes, value


def test_a_failed_control_makes_quality_null_but_speed_still_decided():
    v = compute(record(failed="dense"))
    assert v["quality_screen"]["pass"] is None and "diverged" in v["quality_screen"]["reason"]
    assert v["speed_screen"]["pass"] is not None
    assert v["arms"]["dense"]["status"] == "FAILED" and v["cost"]["dense"] is None


def test_a_failed_single_arm_makes_the_speed_screen_null():
    v = compute(record(failed="single"))
    assert v["speed_screen"]["pass"] is None and "single" in v["speed_screen"]["reason"]


def test_cost_counts_host_hours_at_the_declared_price_and_projects_cross_zone_bytes():
    metrics = {"perf/wall_s": 1800.0, "perf/gpu_s_active": 100.0, "perf/gpu_s_total": 3600.0,
               "comm/logical_bytes_total": 2e9, "comm/host0/wire_tx_bytes_total": 5e9,
               "comm/host0/wire_rx_bytes_total": 5e9, "comm/host1/wire_tx_bytes_total": 5e9,
               "comm/host1/wire_rx_bytes_total": 5e9}
    two_hosts = arm_cost(load_plan("full"), "dense", metrics, ["a", "b"])
    assert two_hosts["host_hours"] == pytest.approx(1.0)  # 0.5 h x 2 hosts
    assert two_hosts["usd"] == pytest.approx(2.24208)  # the study's g6e.2xlarge price
    emulated = arm_cost(PLAN, "dense", metrics, ["a", "b"])  # the tiny profile runs on CPUs
    assert emulated["usd"] == pytest.approx(0.1008)  # priced as the 2-core host it ran on
    assert emulated["usd_on_study_hosts"] == pytest.approx(2.24208)  # the study's hosts: a projection
    assert two_hosts["cross_zone_usd"] == pytest.approx(20e9 / 1e9 * 0.01)
    one_host = arm_cost(PLAN, "dense", metrics, ["a"])  # both ranks on one machine: nothing crossed
    assert one_host["cross_zone_usd"] == 0.0
    # two hosts each send and receive the logical volume once, with TCP/IP headers: the budget check's figure
    assert one_host["cross_zone_usd_projected_from_logical"] == pytest.approx(4 * 2e9 * 1514 / 1448 / 1e9 * 0.01)
    single = arm_cost(PLAN, "single", metrics, ["a"])
    assert single["host_hours"] == pytest.approx(0.5) and single["cross_zone_usd_projected_from_logical"] == 0


def test_faster_with_more_gpu_time_is_called_a_time_reduction_not_a_cost_reduction():
    words = cost_words({"gpu_s_active": 160.0, "gpu_s_total": 200.0}, {"gpu_s_active": 100.0, "gpu_s_total": 120.0}, 1.25,
                       "single")
    assert "time only" in words and "not a cost reduction" in words and "1.67x single's total" in words
    assert "reduced cost" in cost_words({"gpu_s_active": 90.0, "gpu_s_total": 95.0},
                                        {"gpu_s_active": 100.0, "gpu_s_total": 110.0}, 2.2, "single")


def test_cheaper_is_decided_on_total_gpu_seconds_with_start_up_and_checkpoint_not_active_ones():
    # fewer active GPU-seconds than single, but a long start-up and checkpoint on two hosts
    words = cost_words({"gpu_s_active": 90.0, "gpu_s_total": 150.0}, {"gpu_s_active": 100.0, "gpu_s_total": 110.0}, 2.2,
                       "single")
    assert "time only" in words and "1.36x single's total GPU-seconds (0.90x its active ones)" in words
    assert "not decided" in cost_words(None, {"gpu_s_active": 1.0}, None, "single")


def test_random_seed_weights_get_no_quality_verdict_but_a_speed_verdict():
    from analysis.preconditions import screen_word
    rec = record()
    rec.plan = load_plan("full")  # random-qwen3-1.7b: throughput work only
    v = compute(rec)
    q = v["quality_screen"]
    assert q["pass"] is None and q["status"] == "not-applicable" and "randomly initialised" in q["reason"]
    assert "checks" not in q  # nothing was decided, not even a partial check
    assert screen_word(q) == "not-applicable"
    assert v["speed_screen"]["pass"] is not None and screen_word(v["speed_screen"]) in ("pass", "fail")
    assert screen_word(compute(record(failed="dense"))["quality_screen"]) == "null"


def test_the_speed_baseline_is_the_plans_not_always_single():
    rec = record(tps=(100.0, 140.0, 150.0))
    assert compute(rec)["speed_screen"]["ratio"] == pytest.approx(1.5)
    rec.plan = load_plan("tiny", {"screen.speed_baseline": "dense"})
    s = compute(rec)["speed_screen"]
    assert s["baseline"] == "dense" and s["ratio"] == pytest.approx(150 / 140) and s["pass"] is False
    # the words compare with the baseline, not with single
    assert f"{150 / 140:.2f}x dense's throughput" in s["cost_words"] and "single" not in s["cost_words"]


def _with_attempts(rec, arm, statuses):
    rec.commitment = {"arms": [{"arm": arm, "attempts": [
        {"attempt": i, "run_id": f"{arm}-{i}", "status": st, "failure_reason": None if st == "FINISHED" else "boom"}
        for i, st in enumerate(statuses, 1)]}]}
    return rec


def test_a_later_permitted_attempt_counts_and_is_noted():
    rec = _with_attempts(record(), "powersgd", ["FAILED", "FINISHED"])
    rec.plan = load_plan("tiny", {"arms.max_attempts": "2"})
    v = compute(rec)
    assert v["quality_screen"]["pass"] is True and any("attempt 2" in n for n in v["quality_screen"]["notes"])
    assert [a["status"] for a in v["arms"]["powersgd"]["attempts"]] == ["FAILED", "FINISHED"]


def test_more_attempts_than_the_plan_permits_decide_nothing():
    v = compute(_with_attempts(record(), "powersgd", ["FAILED", "FINISHED"]))  # the plan permits 1
    for screen in ("quality_screen", "speed_screen"):
        assert v[screen]["pass"] is None and "arms.max_attempts=1" in v[screen]["reason"]


def test_bytes_after_warm_up_cover_exactly_the_updates_after_the_plans_warm_up():
    """Per-step byte histories with a distinct power of two per update: each sum names exactly the
    updates it covers, so `>=` for `>` (the warm-up's last update counted) changes it."""
    from dataclasses import replace

    from gradshare.contract import metrics as M

    warm = PLAN.powersgd.warmup_updates
    updates = range(1, warm + 5)
    rec = record()
    hist = {M.LOGICAL_BYTES: [(u, float(2 ** u)) for u in updates],
            M.WIRE_TX_BYTES: [(u, float(3 * 2 ** u)) for u in updates],
            M.WIRE_RX_BYTES: [(u, float(5 * 2 ** u)) for u in updates]}
    rec.arms["powersgd"] = replace(rec.arms["powersgd"], histories=hist, hosts=["h1", "h2"])
    got = compute(rec)["cost"]["powersgd"]
    after = sum(2 ** u for u in range(warm + 1, warm + 5))  # updates warm+1 .. warm+4, none before
    assert got["logical_bytes_after_warmup"] == after
    assert got["wire_tx_per_host_after_warmup"] == 3 * after / 2  # two hosts
    assert got["wire_rx_per_host_after_warmup"] == 5 * after / 2
