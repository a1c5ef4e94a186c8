"""Metering: host wire counters and step clocks (cost arithmetic lives in `gradshare.cost`).

Wire bytes come from the OS counters of the host's network interfaces
(`/proc/net/dev`), so they include everything the host actually sent: gradients,
protocol overhead, logging. Loopback is kept apart: two ranks on one host talk over
it, two hosts talk over their real interfaces.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path

PROC_NET_DEV = Path("/proc/net/dev")


def read_interfaces(path: Path = PROC_NET_DEV) -> dict[str, tuple[int, int]]:
    """Interface -> (rx_bytes, tx_bytes) from the kernel's counters; {} where unavailable."""
    try:
        lines = path.read_text().splitlines()[2:]
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) >= 9:
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def host_counters() -> dict:
    """This host's totals: non-loopback wire bytes and loopback bytes, with the host name."""
    ifs = read_interfaces()
    wire = [v for k, v in ifs.items() if k != "lo"]
    lo = ifs.get("lo", (0, 0))
    return {"host": socket.gethostname(), "wire_rx": sum(v[0] for v in wire),
            "wire_tx": sum(v[1] for v in wire), "lo_rx": lo[0], "lo_tx": lo[1]}


def per_host_delta(before: list[dict], after: list[dict]) -> dict[str, dict[str, int]]:
    """Counters gathered from every rank, before and after: deltas per distinct host."""
    first = {c["host"]: c for c in before}
    out = {}
    for c in after:
        if c["host"] in out or c["host"] not in first:
            continue
        out[c["host"]] = {k: c[k] - first[c["host"]][k] for k in ("wire_rx", "wire_tx", "lo_rx", "lo_tx")}
    return out


class Clock:
    """Wall-clock seconds of a region; `sync` (e.g. torch.cuda.synchronize) runs at both ends
    so that queued GPU work is counted in the step that issued it."""

    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)

    def __enter__(self):
        self.sync()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.sync()
        self.seconds = time.perf_counter() - self.t0
