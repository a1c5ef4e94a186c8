"""Two emulated hosts (network namespaces, a tc-shaped veth link): the dense and powersgd arms
of the README's first command run across them with the real multi-node launch, and each
host's wire bytes are metered and billed. (The link and its script: tests/unit/hosts/test_two_hosts.py.)

Skipped with the reason where namespaces cannot be made (not root, no `ip`/`tc`).
"""
from __future__ import annotations

import json

import pytest

from gradshare.contract import metrics as M
from gradshare.hosts import netns
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ARM
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import SMALL

pytestmark = pytest.mark.e2e

REASON = netns.unavailable()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts here: {REASON}")

PLAN = load_plan("tiny", SMALL)
# Each host's wire bytes over its logical bytes, whole arm: the initial weight broadcast
# (one model, 5.8 MB), TCP/IP headers (~4% at MTU 1500), the counters gathered per update.
WIRE_FACTOR = 1.6


def _post_warmup(run, key: str) -> float:
    hist = connection.client().get_metric_history(run.info.run_id, key)
    return sum(m.value for m in hist if m.step > PLAN.powersgd.warmup_updates)


@pytest.fixture(scope="module")
def two_host_arms(first_command_study):
    """The dense and powersgd arms of the README's first command (conftest): each machine rank
    started with `mlflow run` in its own namespace, as a person starts them on two hosts."""
    return {r.data.tags[ARM]: r for r in first_command_study.by_step("train")
            if r.data.tags[ARM] in ("dense", "powersgd")}


@needs_hosts
def test_dense_and_powersgd_run_across_two_hosts_and_each_host_meters_real_wire_bytes(two_host_arms):
    table = {}
    for arm, run in two_host_arms.items():
        m = run.data.metrics
        assert run.data.params["link"].startswith("emulated: two hosts")
        assert run.data.params["num_machines"] == "2" and run.data.params["main_process_ip"] == "198.18.0.1"
        assert run.data.params["torch_threads_per_rank"] == "1,1"
        steps = connection.client().get_metric_history(run.info.run_id, M.LOGICAL_BYTES)
        assert sorted(s.step for s in steps) == list(range(1, PLAN.schedule.updates + 1))
        # two network stacks: two hosts measured, each with one rank
        assert M.host_wire_tx_total(1) in m and M.host_wire_tx_total(2) not in m
        logical = m[M.LOGICAL_BYTES_TOTAL]
        row = {"logical_bytes": logical, "active_s": round(m[M.ACTIVE_S], 1),
               # the same updates as the wire figures below (dense's summary counts all of them)
               "logical_post_warmup": _post_warmup(run, M.LOGICAL_BYTES)}
        for j in (0, 1):
            tx, rx = m[M.host_wire_tx_total(j)], m[M.host_wire_rx_total(j)]
            row[f"host{j}"] = {"wire_tx": tx, "wire_rx": rx, "tx/logical": round(tx / logical, 3),
                               "rx/logical": round(rx / logical, 3),
                               "wire_tx_post_warmup": _post_warmup(run, M.host_wire_tx(j)),
                               "wire_rx_post_warmup": _post_warmup(run, M.host_wire_rx(j))}
            # every logical byte a rank exchanged crossed the link, and not much else did
            assert logical <= tx <= WIRE_FACTOR * logical, (arm, j, tx, logical)
            assert logical <= rx <= WIRE_FACTOR * logical, (arm, j, rx, logical)
        table[arm] = row
    print(json.dumps(table, indent=1))
    d, p = table["dense"], table["powersgd"]
    logical_ratio = d["logical_post_warmup"] / p["logical_post_warmup"]
    assert logical_ratio > 2
    for j in (0, 1):
        for k in ("wire_tx_post_warmup", "wire_rx_post_warmup"):
            wire_ratio = d[f"host{j}"][k] / p[f"host{j}"][k]
            print(f"host{j} {k}: wire ratio dense/powersgd {wire_ratio:.2f}, logical {logical_ratio:.2f}")
            assert wire_ratio >= logical_ratio / 2, (j, k, wire_ratio, logical_ratio)


@needs_hosts
def test_the_reports_cross_zone_dollars_are_the_measured_bytes_at_the_plans_rate_each_way(
        first_command_study, two_host_arms, tmp_path):
    """Two emulated hosts in the plan's two zones: every byte a host sends or receives on the
    link is billed at infra.cross_zone_usd_per_gb, in each direction (the first command's report)."""
    [run] = first_command_study.by_step("analyze")
    v = json.loads(study_runs.download(run.info.run_id, "verdicts.json", tmp_path).read_text())
    report = study_runs.download(run.info.run_id, "report.md", tmp_path).read_text()
    assert PLAN.infra.cross_zone_usd_per_gb == 0.01
    for arm, arm_run in two_host_arms.items():
        m = arm_run.data.metrics
        measured = sum(m[M.host_wire_tx_total(j)] + m[M.host_wire_rx_total(j)] for j in (0, 1))
        usd = measured / 1e9 * PLAN.infra.cross_zone_usd_per_gb
        assert v["cost"][arm]["cross_zone_bytes"] == measured
        assert v["cost"][arm]["cross_zone_usd"] == pytest.approx(usd)
        assert f"| {usd:.6f} |" in report
