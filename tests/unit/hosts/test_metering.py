"""Wire metering: the OS's own counters, one count per network stack however many ranks share it."""
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gradshare.train import faults
from gradshare.hosts import metering
from tests.conftest import REPO


def _proc_net_dev() -> dict[str, tuple[int, int]]:
    """The kernel's table read by hand: interface -> (rx_bytes, tx_bytes)."""
    out = {}
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


@pytest.mark.skipif(not Path("/proc/net/dev").exists(), reason="no /proc/net/dev (not Linux)")
def test_psutil_counters_agree_with_proc_net_dev():
    before = _proc_net_dev()
    got = metering.read_nics()
    after = _proc_net_dev()
    assert set(got) == set(before) == set(after)
    for nic, (rx, tx) in got.items():  # traffic between the reads only ever adds
        assert before[nic][0] <= rx <= after[nic][0], nic
        assert before[nic][1] <= tx <= after[nic][1], nic


def _snap(host_id: str, nics: dict) -> dict:
    return {"host_id": host_id, "host": f"label-{host_id}", "nics": nics}


def test_two_ranks_on_one_host_count_its_interfaces_once():
    before = [_snap("h1", {"eth0": (100, 200), "lo": (5, 5)}), _snap("h1", {"eth0": (100, 200), "lo": (5, 5)}),
              _snap("h2", {"eth0": (0, 0), "lo": (0, 0)})]
    after = [_snap("h1", {"eth0": (150, 260), "lo": (25, 25)}), _snap("h1", {"eth0": (151, 262), "lo": (26, 26)}),
             _snap("h2", {"eth0": (7, 9), "lo": (0, 0)})]
    d = metering.per_host_delta(before, after)
    assert d == {"h1": {"wire_rx": 50, "wire_tx": 60, "lo_rx": 20, "lo_tx": 20},
                 "h2": {"wire_rx": 7, "wire_tx": 9, "lo_rx": 0, "lo_tx": 0}}
    assert metering.ordered_labels(after) == ["label-h1", "label-h2"]


def test_an_interface_that_appears_or_restarts_between_reads_adds_nothing_negative():
    before = _snap("h", {"eth0": (100, 100), "veth1": (500, 500)})
    after = _snap("h", {"eth0": (110, 120), "veth1": (3, 4), "veth2": (9, 9)})
    assert metering.delta(before, after) == {"wire_rx": 10, "wire_tx": 20, "lo_rx": 0, "lo_tx": 0}


def test_the_phases_are_start_to_first_update_steps_checkpoint_and_start_to_end():
    snap = lambda n: [_snap("h", {"eth0": (n, 2 * n)})]  # noqa: E731
    steps = {"h": {"wire_rx": 3, "wire_tx": 6, "lo_rx": 0, "lo_tx": 0}}
    p = metering.phases(snap(0), snap(10), steps, snap(20), snap(25))
    assert list(p) == list(metering.PHASES)
    assert p["startup"]["h"]["wire_rx"] == 10 and p["steps"] is steps
    assert p["checkpoint"]["h"]["wire_tx"] == 10 and p["total"]["h"]["wire_rx"] == 25


def _host_id_in(netns: str | None) -> str:
    code = "from gradshare.hosts.metering import host_identity; print(host_identity()[0])"
    cmd = [sys.executable, "-c", code]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def _netns_usable() -> str | None:
    """Why `ip netns` cannot be used here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def test_a_host_is_one_network_stack_stable_within_it_distinct_across_namespaces():
    here = _host_id_in(None)
    assert here == _host_id_in(None) == metering.host_identity()[0] and len(here) == 64
    why = _netns_usable()
    if why:
        pytest.skip(f"second namespace not testable: {why}")
    name = f"gradshare-test-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` refused: {made.stderr.strip()}")
    try:
        inside = _host_id_in(name)
        assert inside == _host_id_in(name)  # stable within the namespace
        assert inside != here  # same host name, same machine: still another host
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_the_fault_switches_are_read_from_the_environment_in_one_place():
    f = faults.from_env({faults.NAN_ENV: "3", faults.HANG_ENV: "5:1"})
    assert f.loss(2, 1.0) == 1.0 and f.loss(3, 1.0) != f.loss(3, 1.0)  # NaN at update 3 only
    slept = []

    def sleep(s):
        slept.append(s)
        if len(slept) == 3:
            raise TimeoutError  # stands in for the peers' timeout: the hang never returns by itself

    f.update_start(5, 0, sleep=sleep)  # another rank: no hang
    f.update_start(4, 1, sleep=sleep)  # another update: no hang
    assert slept == []
    with pytest.raises(TimeoutError):
        f.update_start(5, 1, sleep=sleep)
    assert faults.from_env({}) == faults.Faults()
    with pytest.raises(ValueError, match="UPDATE:RANK"):
        faults.from_env({faults.HANG_ENV: "5"})
    assert faults.from_env({faults.STOP_AFTER_RESULT_ENV: "1"}).stop_after_result_rank == 1
    with pytest.raises(ValueError, match=faults.STOP_AFTER_RESULT_ENV):
        faults.from_env({faults.STOP_AFTER_RESULT_ENV: "last"})
    after = faults.from_env({faults.STOP_AFTER_RESULT_ENV: "1"})
    stopped, waited = [], []
    after.before_last_barrier(0, lambda: True, sleep=waited.append, stop=lambda: stopped.append(0))
    assert stopped == []  # another rank goes on
    written = iter([False, False, True])
    after.before_last_barrier(1, lambda: next(written), sleep=waited.append, stop=lambda: stopped.append(1))
    assert stopped == [1] and len(waited) == 2  # rank 1 stops once rank 0's result is written
    waited.clear()
    after.before_last_barrier(1, lambda: False, sleep=waited.append, stop=lambda: stopped.append(1))
    assert stopped == [1, 1] and abs(sum(waited) - faults.RESULT_WAIT_S) < 0.5  # no result: after the wait
