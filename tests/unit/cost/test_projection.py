"""The projection: the study's hosts from the prepared workload and the H200's measured cost parts
(`gradshare.cost.projection`, `gradshare.cost.gpu_cost`), checked against figures worked out by hand; the
parts fitted on one of the H200 call's workloads predict the other; shorter documents shrink the
matrix part only; a study's own machine re-projected from its runs (`gradshare.cost.link`). (The
calibration script and `gradshare project` run as commands: tests/e2e/test_projection_commands.py.)"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from gradshare.cost import gpu_cost
from gradshare.cost import link as ML
from gradshare.cost import projection as P
from gradshare.contract.plan import load_plan
from gradshare.cost.volume import WIRE_OVERHEAD, cross_zone_bytes, wire_bytes_per_rank
from gradshare.inputs.workload import describe, medians
from tests.conftest import REPO

OVERHEAD = (1448 + 14 + 20 + 32) / 1448  # payload + Ethernet, IP, TCP-with-timestamps headers


def _record(n_updates=16, w1=(4096, 2), w2=(2048, 1), tokens=3000):
    ups = [{"input_tokens": tokens, "target_tokens": tokens - 500,
            "w1": {"padded_tokens": w1[0], "micro_batches": w1[1]},
            "w2": {"padded_tokens": w2[0], "micro_batches": w2[1]}} for _ in range(n_updates)]
    return {"updates": ups, "median": medians(ups), "layout": "by hand", "plan_sha256": "-"}


def _calibration():
    gpu = gpu_cost.GpuRates("ref", matmul_tflops=800.0, memory_gbps=4000.0, pinned_both_gbps=100.0, source="by hand")
    return gpu_cost.Calibration(gpu=gpu, s_per_padded_token=20e-6, s_per_micro_batch=0.005, s_fixed=0.02,
                                dense_extra_s=0.01, compress_s=0.03, error_bytes=6e9, source="by hand", checks={})


def test_each_part_scales_by_the_rate_it_is_bound_by():
    target = gpu_cost.GpuRates("half", matmul_tflops=400.0, memory_gbps=1000.0, pinned_both_gbps=50.0, source="-")
    c = _calibration().scaled_to(target)
    plan = load_plan("full", {})
    parts = c.parts(plan.arm("powersgd"), plan, 2048, 1)
    assert parts["matrix"] == pytest.approx(2048 * 20e-6 * 2)  # half the matrix rate
    assert parts["micro_batches"] == pytest.approx(0.005 * 4)  # a quarter of the memory bandwidth
    assert parts["fixed"] == pytest.approx(0.08) and parts["dense_extra"] == pytest.approx(0.04)
    assert parts["compress"] == pytest.approx(0.12)
    # up and down, both ways at once, at half the rate; with no staging only the compression covers them
    assert parts["error_copies_exposed"] == pytest.approx(2 * 6e9 / 50e9)  # measured with no overlap
    assert set(c.parts(plan.arm("single"), plan, 1, 1)) == {"matrix", "micro_batches", "fixed"}
    # PowerSGD's warm-up update is a plain all-reduce: dense's parts, no compression or copies
    assert c.parts(plan.arm("powersgd"), plan, 1, 1, update=1) == c.parts(plan.arm("dense"), plan, 1, 1)


def test_the_error_copies_hide_behind_the_micro_batches_as_far_as_the_staging_lets_them():
    # a 20e-6 s/token, b 0.005 s/micro-batch, compression 0.03 s, 6 GB of error, 100 GB/s, measured on the
    # hook that folds the error in during the micro-batches
    c = replace(_calibration(), copy_overlap="fold")
    plan = load_plan("full", {})
    psgd = plan.arm("powersgd")
    copies = 2 * 6e9 / 100e9  # 0.12 s, up and down at once
    # one micro-batch of 2,048 tokens (0.046 s of compute), 1 GB of staging: 1 GB up at 50 GB/s (0.02 s)
    got = c.copies(psgd, 2048, 1, 1e9)
    assert got["covered_s"] == pytest.approx(1e9 / 50e9 + 0.03)
    assert got["exposed_s"] == pytest.approx(copies - 1e9 / 50e9 - 0.03)
    # eight micro-batches: the staging would let all 6 GB up, but only 0.368 s of compute runs beside them
    many = c.copies(psgd, 8 * 2048, 8, 1e9)
    assert many["covered_s"] == pytest.approx(6e9 / 50e9 + 0.03) and many["exposed_s"] == 0.0
    # the compute is the limit where the staging is not: 100 tokens and one micro-batch
    short = c.copies(psgd, 100, 1, 6e9)
    assert short["covered_s"] == pytest.approx(100 * 20e-6 + 0.005 + 0.03)
    # the parts carry the exposed copies; an arm at rank 8 keeps the rank-32 compression where one rank
    # was measured, and follows the slope where two were
    staged = load_plan("full", {"powersgd.fold_errors": "true", "powersgd.hook": "fast", "powersgd.staging_mb": "1000"})
    assert staged.powersgd.staging_bytes() == 1000 * 2**20
    assert c.parts(psgd, staged, 2048, 1)["error_copies_exposed"] == pytest.approx(
        c.copies(psgd, 2048, 1, 1000 * 2**20)["exposed_s"])
    rank8_plan = load_plan("full", {"arms.rows": "single:single:1,dense:dense:2,powersgd:powersgd:2:rank=8"})
    rank8 = rank8_plan.arm("powersgd")
    assert c.compression_s(rank8.rank) == pytest.approx(0.03)
    sloped = replace(c, compress_s_per_rank=0.0005)
    assert sloped.parts(rank8, rank8_plan, 2048, 1)["compress"] == pytest.approx(0.03 - 24 * 0.0005)
    # a calibration measured on a hook that moves each bucket's error in its own call covers nothing
    whole = _calibration().copies(psgd, 8 * 2048, 8, 6e9)
    assert (whole["covered_s"], whole["exposed_s"]) == (0.0, pytest.approx(copies))


def test_the_projection_with_a_folding_calibration_by_hand():
    plan = load_plan("full", {"schedule.updates": "128", "powersgd.fold_errors": "true"})
    # measured on the plan's own GPU (nothing scaled), on the hook that folds the error in
    cal = replace(_calibration(), copy_overlap="fold", gpu=gpu_cost.declared_gpu(plan), checks={"w": {"error": 0.01}})
    both = plan.infra.host_pinned_both_gbps * 1e9
    h = P.Hosts(plan, _record(n_updates=16), cal, "by hand")
    link = 20e9
    rank = 2048 * 20e-6 + 0.005 + 0.02
    staging = 512 * 2**20  # the full profile's powersgd.staging_mb: one micro-batch lets that much up
    exposed = 2 * 6e9 / both - (min(2048 * 20e-6 + 0.005, staging / (both / 2)) + 0.03)
    assert exposed > 0
    dense_t = rank + 0.01 + h.dense_bytes * OVERHEAD * 8 / link
    psgd_t = rank + 0.01 + 0.03 + exposed + h.compressed_bytes * OVERHEAD * 8 / link
    warm = plan.powersgd.warmup_updates
    rows = {r["arm"]: r for r in h.table(2, link / 1e6)}
    assert rows["powersgd"]["seconds"] == pytest.approx(warm * dense_t + (16 - warm) * psgd_t)
    p = P.compute(plan, _record(n_updates=16), "by hand", cal)
    assert p["error_copies"]["powersgd"]["exposed_s"] == pytest.approx(exposed)
    assert "declared: infra.host_pinned_both_gbps" in p["host_link_source"]
    assert f"exposed {exposed:.3f} s" in P.markdown(p)
    # without the fold nothing lets the error up during the micro-batches: only the compression covers
    unfolded = load_plan("full", {"schedule.updates": "128"})
    assert unfolded.powersgd.staging_bytes() == 0.0
    psgd = unfolded.arm("powersgd")
    assert cal.parts(psgd, unfolded, 2048, 1)["error_copies_exposed"] == pytest.approx(2 * 6e9 / both - 0.03)


def test_the_study_hosts_by_hand():
    plan = load_plan("full", {"schedule.updates": "128"})
    h = P.Hosts(plan, _record(n_updates=16), _calibration(), "by hand")
    h.cost = _calibration()  # the reference GPU itself, so that the figures below are the parts'
    single = 4096 * 20e-6 + 2 * 0.005 + 0.02
    rank = 2048 * 20e-6 + 0.005 + 0.02
    link = 20e9
    dense_t = rank + 0.01 + h.dense_bytes * OVERHEAD * 8 / link  # 2 hosts: 2(W-1)/W = 1
    assert h.dense_bytes == 4 * 1_720_574_976
    warm = plan.powersgd.warmup_updates  # 8 plain all-reduces, then compressed
    psgd_t = rank + 0.01 + 0.03 + 2 * 6e9 / 100e9 + h.compressed_bytes * OVERHEAD * 8 / link
    rows = {r["arm"]: r for r in h.table(2, link / 1e6)}
    assert rows["single"]["seconds"] == pytest.approx(16 * single)
    assert rows["dense"]["seconds"] == pytest.approx(16 * dense_t)
    assert rows["powersgd"]["seconds"] == pytest.approx(warm * dense_t + (16 - warm) * psgd_t)
    assert rows["dense"]["speed_ratio"] == pytest.approx(single / dense_t)  # the same tokens, one update each
    assert rows["dense"]["gpu_s"] == pytest.approx(2 * 16 * dense_t)
    assert rows["dense"]["cross_zone_bytes"] == pytest.approx(16 * 2 * 2 * h.dense_bytes * OVERHEAD)
    i = plan.infra
    assert rows["dense"]["usd"] == pytest.approx(2 * 16 * dense_t / 3600 * i.usd_per_host_hour
                                                 + rows["dense"]["cross_zone_bytes"] / 1e9 * i.cross_zone_usd_per_gb)
    # four hosts keep a rank's share: the 16 updates' documents take 8 updates, each sending 1.5 B
    four = h.arm("dense", 4, link / 1e6)
    assert four["seconds"] == pytest.approx(8 * (rank + 0.01 + h.dense_bytes * 1.5 * OVERHEAD * 8 / link))


class _CharTokenizer:
    """One token per character: enough for `encode`, so that lengths are exact by construction."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] * len(text)}


def test_documents_half_as_long_shrink_the_matrix_part_only():
    plan = load_plan("full", {})
    tok = _CharTokenizer()

    def record(length):
        docs = {f"d{k:03d}": {"id": f"d{k:03d}", "prompt": "", "target": "x" * length} for k in range(64)}
        ids = sorted(docs)
        schedule = {"updates": [ids[:32], ids[32:]], "max_doc_tokens": 512, "target_tokens": [0, 0]}
        return describe(plan, docs, tok, schedule)

    full, half = record(100), record(50)
    assert half["median"]["input_tokens"] == full["median"]["input_tokens"] / 2
    h_full, h_half = (P.Hosts(plan, r, gpu_cost.load(), "by hand") for r in (full, half))
    for arm in ("dense", "powersgd"):  # a rank's 16 documents: one micro-batch either way
        a = h_full.cost.parts(plan.arm(arm), plan, full["median"]["w2_padded_tokens"], full["median"]["w2_micro_batches"])
        b = h_half.cost.parts(plan.arm(arm), plan, half["median"]["w2_padded_tokens"], half["median"]["w2_micro_batches"])
        assert {k for k in a if a[k] != b[k]} == {"matrix"}
        assert b["matrix"] == pytest.approx(a["matrix"] / 2)


def test_the_break_even_link_is_where_the_speed_screen_is_met(monkeypatch):
    plan = load_plan("full", {})
    h = P.Hosts(plan, _record(), _calibration(), "by hand")
    h.cost = replace(_calibration(), compress_s=0.0, dense_extra_s=0.0, error_bytes=0.0)  # only the link stands in the way
    b = P.break_even(h, "dense")
    assert h.ratio("dense", 2, b["link_mbit_for_speed"]) == pytest.approx(plan.screen.speed_ratio, rel=1e-6)
    # with the error's copies the screen cannot pass at any link
    h.cost = _calibration()
    slow = P.break_even(h)
    assert slow["link_mbit_for_speed"] is None and slow["ratio_at_infinite_link"] < plan.screen.speed_ratio


# --- a study's own machine (gradshare.cost.link) -------------------------------------

def _machine(extra=0.1, logical=1e6, link=8.0):
    return ML.Machine(name="m", single_s=1.0, tokens_per_update=1000, usd_per_host_hour=3.6,
                      cross_zone_usd_per_gb=0.01, link_mbit=link, arms={"dense": ML.ArmInputs(extra, logical)})


def test_a_measured_machine_over_a_slow_link_by_hand():
    m = _machine()
    link_s = 1e6 * OVERHEAD * 8 / 8e6  # 1 MB with headers at 8 Mbit/s: 1.0456 s
    t = 0.5 + 0.1 + link_s
    got = ML.project(m, "dense", 2, 8.0, train_docs=64, docs_per_update=8)
    assert got["s_per_update"] == pytest.approx(t)
    assert got["updates"] == 8 and got["gpu_s"] == pytest.approx(8 * t * 2)
    assert got["cross_zone_bytes"] == pytest.approx(2 * 2 * 1e6 * OVERHEAD * 8)
    assert ML.project(m, "dense", 4, 8.0, 64, 8)["s_per_update"] == pytest.approx(0.6 + 1e6 * 1.5 * OVERHEAD * 8 / 8e6)


def test_one_wire_formula_for_the_budget_the_cost_table_and_the_projection():
    assert WIRE_OVERHEAD == pytest.approx(OVERHEAD)
    assert wire_bytes_per_rank(1e6, 2) == pytest.approx(1e6 * OVERHEAD)
    assert cross_zone_bytes(1e6, 2) == pytest.approx(4e6 * OVERHEAD)  # two hosts, each sends and receives
    assert cross_zone_bytes(1e6, 1) == 0


def test_an_arm_measured_over_loopback_is_not_extrapolated():
    plan = load_plan("tiny", {})
    rows = ML.grid(_machine(link=math.inf), plan, hosts=(2, 8, 64), rates_mbit=[10.0, 100.0])
    assert [(r["arm"], r["hosts"], r["rate_mbit"]) for r in rows] == [("single", 1, math.inf), ("dense", 2, math.inf)]


def test_measured_inputs_are_recovered_and_reproduce_the_measurement():
    plan = load_plan("tiny", {})
    b = 5.77e6
    t = 0.2 + 0.05 + ML.exchange_s(b, 2, 22.0)
    arms = {"single": {"step_s": [(u, 0.4) for u in range(1, 20)]},
            "dense": {"step_s": [(1, 9.0)] + [(u, t) for u in range(2, 20)],
                      "logical_bytes": [(u, b) for u in range(1, 20)], "link_rate_mbit": "22"},
            "powersgd": {"step_s": [(u, 0.3) for u in range(1, 20)],
                         "logical_bytes": [(u, 1e5) for u in range(1, 20)], "link_rate_mbit": "inf"}}
    m = ML.from_measurements(plan, arms, "here")
    assert m.single_s == 0.4
    assert m.arms["dense"].extra_s == pytest.approx(0.05)
    assert m.arms["powersgd"].extra_s == pytest.approx(0.1)  # loopback: no link term
    assert ML.s_per_update(m, "dense", 2, 22.0) == pytest.approx(t)
    with pytest.raises(ValueError, match="single"):
        ML.from_measurements(plan, {k: v for k, v in arms.items() if k != "single"}, "here")


def _runs(t, b, rate, n=20):
    return {"step_s": [(u, t) for u in range(1, n)], "logical_bytes": [(u, b) for u in range(1, n)],
            "link_rate_mbit": rate}


def test_a_link_efficiency_fitted_at_one_rate_predicts_another():
    """An arm whose exchange crossed the link at 80% of its rate: fitted at 22 Mbit/s from the
    loopback machine and one run, the prediction at 11 Mbit/s is the hand-computed one."""
    plan = load_plan("tiny", {})
    b, c1, x, e = 5.77e6, 0.4, 0.05, 0.8
    wire_s = lambda rate: b * OVERHEAD * 8 / (rate * 1e6)  # one rank's share of a two-rank ring
    loop = ML.from_measurements(plan, {"single": {"step_s": [(u, c1) for u in range(1, 20)]},
                                       "dense": _runs(c1 / 2 + x, b, "inf")}, "here")
    at22 = c1 / 2 + x + wire_s(22.0) / e
    m = ML.with_link_efficiency(loop, plan, {"dense": _runs(at22, b, "22")})
    assert m.arms["dense"].link_efficiency == pytest.approx(e)
    assert m.arms["dense"].extra_s == pytest.approx(x)
    assert m.link_mbit == 22.0 and m.measured_s["dense"] == pytest.approx(at22)
    assert ML.s_per_update(m, "dense", 2, 11.0) == pytest.approx(c1 / 2 + x + wire_s(11.0) / e)
    # without the efficiency the same machine under-predicts the slow link by the lost fifth
    assert ML.s_per_update(loop, "dense", 2, 11.0) == pytest.approx(c1 / 2 + x + wire_s(11.0))


def test_a_link_efficiency_needs_a_loopback_machine_and_one_rate_with_link_time():
    plan = load_plan("tiny", {})
    b = 5.77e6
    loop = ML.from_measurements(plan, {"single": {"step_s": [(u, 0.4) for u in range(1, 20)]},
                                       "dense": _runs(0.25, b, "inf"), "powersgd": _runs(0.3, 1e5, "inf")},
                                "here")
    with pytest.raises(ValueError, match="no link time"):
        ML.with_link_efficiency(loop, plan, {"dense": _runs(0.25, b, "22")})
    with pytest.raises(ValueError, match="one link rate"):
        ML.with_link_efficiency(loop, plan, {"dense": _runs(3.0, b, "22"), "powersgd": _runs(1.0, 1e5, "44")})
    with pytest.raises(ValueError, match="one link rate"):
        ML.with_link_efficiency(loop, plan, {"dense": _runs(3.0, b, "inf")})
    linked = ML.with_link_efficiency(loop, plan, {"dense": _runs(3.0, b, "22")})
    with pytest.raises(ValueError, match="loopback"):
        ML.with_link_efficiency(linked, plan, {"dense": _runs(3.0, b, "22")})


def test_the_link_benchmark_refits_a_recorded_result(tmp_path):
    """`benchmarks/link_rates.py --refit` on the 12-04 CPU result: the plan's 22 Mbit/s runs are
    marked fitted, the 11 and 44 Mbit/s rows are predictions with an error each; a bad rate list
    is refused by name."""
    recorded = REPO / "benchmarks/results/2026-12-04-cpu-5280656-link_rates.json"
    out = tmp_path / "refit.json"
    done = subprocess.run([sys.executable, "benchmarks/link_rates.py", "--refit", str(recorded), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["fit_rate_mbit"] == 22.0 and set(data["inputs"]["link_efficiency"]) == {"dense", "powersgd"}
    for link, arms in data["links"].items():
        for arm, got in arms.items():
            if link == "loopback":
                assert "projected_s" not in got
            else:
                assert got["fitted"] == (link == "22")
    assert "| 22 Mbit/s | dense |" in done.stdout and "fitted |" in done.stdout
    assert done.stdout.count("%") >= 4  # four predicted rows carry an error
    bad = subprocess.run([sys.executable, "benchmarks/link_rates.py", "--rates", "abc"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--rates" in bad.stderr


def test_one_function_gives_every_arms_bytes_per_update_for_the_loop_the_budget_and_the_projection():
    from gradshare.cost.volume import exchange_bytes
    from gradshare.kinds.powersgd import compressed_elements

    plan = load_plan("tiny", {"powersgd.warmup_updates": "3"})
    shapes = [(512, 256), (256,), (1024, 512)]
    b = exchange_bytes(plan, shapes)
    assert b.dense == 4 * (512 * 256 + 256 + 1024 * 512)
    assert b.compressed == 4 * compressed_elements(shapes, plan.powersgd.rank, plan.powersgd.min_compression_rate)
    assert b.compressed < b.dense
    assert [b.of(plan.arm("single"), u) for u in (1, 4)] == [0, 0]
    assert [b.of(plan.arm("dense"), u) for u in (1, 3, 4)] == [b.dense] * 3
    # the warm-up's last update is still a plain all-reduce; compression starts the update after
    assert [b.of(plan.arm("powersgd"), u) for u in (1, 3, 4)] == [b.dense, b.dense, b.compressed]
