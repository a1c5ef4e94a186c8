"""A link taken down mid-arm between two emulated hosts (issue 44, case 3): inside
`arms.link_silence_s` the arm waits for it and finishes, every update, its one attempt; past the
bound it ends FAILED with "no traffic from host 1 (addr) for N s", named within a few seconds of
the bound, and nothing of the arm is left running. The link is taken down from outside, as a
switch or a cloud network would (`ip link set gslink down` on host 0's side), while the arm's
run shows update 2 done.

Skipped with the reason where namespaces cannot be made (not root, no `ip`/`tc`).
"""
from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from gradshare.contract import metrics as M
from gradshare.contract.tags import ATTEMPT, CKPT_SHA, FAILURE, REFUSAL
from gradshare.hosts import netns
from gradshare.steps.emulated import run_arm_across
from gradshare.tracking import connection, study_runs
from gradshare.train.supervise import WATCH_EVERY_S
from tests.conftest import overrides, run_entry

pytestmark = pytest.mark.e2e

REASON = netns.unavailable()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts here: {REASON}")

RATE_MBIT = 22.0  # the tiny profile's link


def _link_down_after(study: str, update: int, seconds: float, log: dict):
    """`meanwhile` for `run_arm_across`: once the arm's run shows `update` done, host 0's side of
    the link goes down for `seconds` (for ever where `seconds` is None, until the hosts are torn down)."""
    def act(hosts) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            runs = study_runs.search(study, "train", "dense")
            if runs and any(m.step >= update for m in
                            connection.client().get_metric_history(runs[0].info.run_id, M.STEP_S)):
                break
            time.sleep(0.2)
        subprocess.run(hosts.exec(0) + ["ip", "link", "set", netns.IFNAME, "down"], check=True)
        log["down_t"] = time.time()
        if seconds is None:
            return
        time.sleep(seconds)
        subprocess.run(hosts.exec(0) + ["ip", "link", "set", netns.IFNAME, "up"], check=True)
        log["up_t"] = time.time()
    return act


def _nothing_left(study: str) -> None:
    """No process of the study's steps, and no namespace made by this test process."""
    mine = [p for p in psutil.process_iter(["cmdline"])
            if any(study in part for part in (p.info["cmdline"] or []))]
    assert not mine, [p.info["cmdline"] for p in mine]
    assert not [n for n in netns.leftovers() if n.startswith(f"gradshare-{os.getpid()}x")]


@needs_hosts
def test_a_link_down_for_30_s_inside_the_bound_leaves_the_arm_finished_with_every_update(mlflow_server, capfd):
    study = "partition-30s"
    run_entry("prepare", "--study", study, *overrides({"arms.link_silence_s": "120"}))
    log: dict = {}
    assert run_arm_across(study, "dense", RATE_MBIT, timeout_s=900, meanwhile=_link_down_after(study, 2, 30, log))
    assert "up_t" in log  # the link was down for 30 s while the arm ran
    [run] = study_runs.search(study, "train", "dense")
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags
    assert run.data.tags[ATTEMPT] == "1" and REFUSAL not in run.data.tags
    steps = sorted(m.step for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert steps == list(range(1, 9))
    assert len(run.data.tags[CKPT_SHA]) == 64  # the weights, recorded
    # the update that waited on the link took the partition's length, at least
    slowest = max(m.value for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert slowest >= 30 - WATCH_EVERY_S, slowest
    out = capfd.readouterr().out
    assert "[host 0] " in out and "no traffic from host 1 (198.18.0.2)" in out and "waits up to arms.link_silence_s 120" in out
    assert "host 1 (198.18.0.2) is heard again: the arm goes on" in out
    _nothing_left(study)


@needs_hosts
def test_a_link_down_past_the_bound_ends_the_arm_with_the_no_traffic_line_and_nothing_left(mlflow_server):
    study = "partition-long"
    bound = 15.0
    run_entry("prepare", "--study", study, *overrides({"arms.link_silence_s": f"{bound:g}"}))
    log: dict = {}
    ok = run_arm_across(study, "dense", RATE_MBIT, timeout_s=900, meanwhile=_link_down_after(study, 2, None, log))
    ended_t = time.time()
    assert not ok
    [run] = study_runs.search(study, "train", "dense")
    assert run.info.status == "FAILED" and REFUSAL not in run.data.tags
    assert run.data.tags[ATTEMPT] == "1"  # the arm failed: its attempt is used
    reason = run.data.tags[FAILURE]
    prefix = "no traffic: arm dense: no traffic from host 1 (198.18.0.2) for "
    assert reason.startswith(prefix), reason
    silent_s = float(reason[len(prefix):].split(" s ", 1)[0])
    # named within a few watch periods of the bound, not at the hang bound or the time limit
    assert bound < silent_s <= bound + 3 * WATCH_EVERY_S + 2, reason
    assert "(arms.link_silence_s 15)" in reason and reason.count("last completed update") == 1
    assert reason.endswith("; last completed update 2 of 8") or reason.endswith("; last completed update 3 of 8")
    assert ended_t - log["down_t"] < 120  # the arm's time limit (260 s) was never reached
    _nothing_left(study)
