"""The projection (`gradshare.projection`): its arithmetic against figures worked out by hand
here, the study's hosts from the config's own numbers, and measured inputs recovered."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from gradshare import projection as P
from gradshare.plan import load_plan
from tests.conftest import REPO

OVERHEAD = (1448 + 14 + 20 + 32) / 1448  # payload + Ethernet, IP, TCP-with-timestamps headers


def _machine(extra=0.1, logical=1e6):
    return P.Machine(name="m", single_s=1.0, tokens_per_update=1000, usd_per_host_hour=3.6,
                     cross_zone_usd_per_gb=0.01, link_mbit=8.0,
                     arms={"dense": P.ArmInputs(extra, logical)})


def test_two_hosts_over_a_slow_link_by_hand():
    m = _machine()
    link_s = 1e6 * OVERHEAD * 8 / 8e6  # 1 MB with headers at 8 Mbit/s: 1.0456 s
    t = 0.5 + 0.1 + link_s
    got = P.project(m, "dense", 2, 8.0, train_docs=64, docs_per_update=8)
    assert got["s_per_update"] == pytest.approx(t)
    assert got["speed_ratio"] == pytest.approx(1 / t)  # the same tokens per update as single
    assert got["updates"] == 8 and got["gpu_s"] == pytest.approx(8 * t * 2)
    # each of two hosts sends 1 MB (+headers) and receives as much, 8 updates
    assert got["cross_zone_bytes"] == pytest.approx(2 * 2 * 1e6 * OVERHEAD * 8)
    assert got["usd"] == pytest.approx(8 * t * 2 / 3600 * 3.6 + got["cross_zone_bytes"] / 1e9 * 0.01)


def test_more_hosts_keep_a_ranks_share_and_send_two_w_minus_one_over_w():
    m = _machine()
    t4 = 0.5 + 0.1 + 1e6 * 1.5 * OVERHEAD * 8 / 8e6
    got = P.project(m, "dense", 4, 8.0, train_docs=64, docs_per_update=8)
    assert got["s_per_update"] == pytest.approx(t4)
    assert got["updates"] == 4  # 4 hosts x 4 documents: 16 documents per update
    assert got["speed_ratio"] == pytest.approx(2 / t4)
    assert P.project(m, "dense", 2, math.inf, 64, 8)["s_per_update"] == pytest.approx(0.6)  # loopback
    single = P.project(m, "single", 4, 8.0, 64, 8)
    assert single["hosts"] == 1 and single["speed_ratio"] == 1 and single["cross_zone_bytes"] == 0


def test_the_study_hosts_come_from_the_config_and_the_plans_declared_figures():
    plan = load_plan("full", {})
    cfg = json.loads((REPO / "gradshare/configs/qwen3_1p7b.json").read_text())
    h, f, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    # per layer: q, k, v, o projections, the MLP's three, two RMSNorms and q/k norms; tied embeddings
    layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h + 2 * cfg["head_dim"]
    params = v * h + L * layer + h
    assert params == 1_720_574_976
    m = P.study_hosts(plan)
    tokens = plan.schedule.docs_per_update * plan.data.max_doc_tokens
    assert m.single_s == pytest.approx(6 * params * tokens / (362e12 * 0.40))
    assert m.arms["dense"].logical_bytes == 4 * params
    assert m.arms["powersgd"].extra_s == plan.infra.powersgd_extra_s
    assert m.arms["powersgd"].logical_bytes < m.arms["dense"].logical_bytes / 20
    assert m.link_mbit == 20_000
    dense = P.project(m, "dense", 2, m.link_mbit, plan.train_docs, plan.schedule.docs_per_update)
    # 6.9 GB with headers over 20 Gbit/s: the LinkPlan docstring's 2.76 s, plus headers
    assert dense["s_per_update"] - m.single_s / 2 == pytest.approx(4 * params * OVERHEAD * 8 / 20e9)


def test_measured_inputs_are_recovered_and_reproduce_the_measurement():
    plan = load_plan("tiny", {})
    # what a run following the model exactly would log: c1 = 0.4 s, dense x = 0.05 s at 22 Mbit/s
    b = 5.77e6
    t = 0.2 + 0.05 + P.exchange_s(b, 2, 22.0)
    arms = {"single": {"step_s": [(u, 0.4) for u in range(1, 20)]},
            "dense": {"step_s": [(1, 9.0)] + [(u, t) for u in range(2, 20)],
                      "logical_bytes": [(u, b) for u in range(1, 20)], "link_rate_mbit": "22"},
            "powersgd": {"step_s": [(u, 0.3) for u in range(1, 20)],
                         "logical_bytes": [(u, 1e5) for u in range(1, 20)], "link_rate_mbit": "inf"}}
    m = P.from_measurements(plan, arms, "here")
    assert m.single_s == 0.4
    assert m.arms["dense"].extra_s == pytest.approx(0.05)
    assert m.arms["powersgd"].extra_s == pytest.approx(0.1)  # loopback: no link term
    assert P.s_per_update(m, "dense", 2, 22.0) == pytest.approx(t)
    with pytest.raises(ValueError, match="single"):
        P.from_measurements(plan, {k: v for k, v in arms.items() if k != "single"}, "here")


def test_the_command_prints_the_table_and_refuses_one_host(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gradshare.cli", "project", "--hosts", "2,4", "--rates-gbit", "20",
                          "--json", str(tmp_path / "p.json")], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "p.json").read_text())["study_hosts"]["rows"]
    dense2 = next(r for r in rows if r["arm"] == "dense" and r["hosts"] == 2)
    assert f"| dense | 2 | 20 Gbit/s | {dense2['s_per_update']:.3f} |" in out.stdout
    assert {(r["arm"], r["hosts"]) for r in rows} == {("single", 1), ("dense", 2), ("dense", 4),
                                                       ("powersgd", 2), ("powersgd", 4)}
    bad = subprocess.run([sys.executable, "-m", "gradshare.cli", "project", "--hosts", "1"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "at least 2 hosts" in bad.stderr
