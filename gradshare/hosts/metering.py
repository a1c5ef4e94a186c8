"""Metering: host wire counters and step clocks (cost arithmetic lives in `gradshare.cost.accounting`).

Wire bytes come from the OS counters of each network interface (psutil, per NIC), so
they include everything the host actually sent: gradients, protocol overhead, logging.
Loopback is kept apart: two ranks on one host talk over it, two hosts talk over their
real interfaces.

A "host" is one network stack, not one host name: containers and network namespaces
share a name but not counters, and one machine's namespaces count separately. Several
ranks on one host see the same counters, so a host is counted once, from its lowest rank.

An arm is metered in phases (each rank reads its counters, rank 0 gathers them):
  startup     worker start through model load and the DDP wrap (its initial weight
              broadcast) up to the first update
  steps       the per-update windows, summed
  checkpoint  rank 0 writing the checkpoint
  total       worker start to end (includes the gaps between the phases above)
"""
from __future__ import annotations

import functools
import hashlib
import os
import socket
import time

import psutil


PHASES = ("startup", "steps", "checkpoint", "total")
KEYS = ("wire_rx", "wire_tx", "lo_rx", "lo_tx")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def host_identity() -> tuple[str, str]:
    """(id, label) of this network stack: the id hashes the host name, machine id, boot id
    and the network namespace's inode; the label is the host name with the id's head."""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    name = socket.gethostname()
    parts = [name, _read("/etc/machine-id"), _read("/proc/sys/kernel/random/boot_id"), netns]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return digest, f"{name}/{digest[:12]}"


def read_nics() -> dict[str, tuple[int, int]]:
    """Interface -> (rx_bytes, tx_bytes) from the kernel's counters."""
    return {nic: (c.bytes_recv, c.bytes_sent) for nic, c in psutil.net_io_counters(pernic=True).items()}


def host_counters() -> dict:
    """This rank's snapshot: host id and label, and every interface's counters."""
    host_id, label = host_identity()
    return {"host_id": host_id, "host": label, "nics": read_nics()}


def delta(before: dict, after: dict) -> dict[str, int]:
    """Bytes between two snapshots of one host. Only interfaces present in both count, and
    a counter that went down (an interface re-created under the same name) counts as 0."""
    out = dict.fromkeys(KEYS, 0)
    for nic, (rx, tx) in after["nics"].items():
        if nic not in before["nics"]:
            continue
        rx0, tx0 = before["nics"][nic]
        kind = "lo" if nic == "lo" else "wire"
        out[f"{kind}_rx"] += max(0, rx - rx0)
        out[f"{kind}_tx"] += max(0, tx - tx0)
    return out


def per_host_delta(before: list[dict], after: list[dict]) -> dict[str, dict[str, int]]:
    """Snapshots gathered from every rank (index = rank), before and after: deltas per
    distinct host id, each taken from the host's lowest rank."""
    out = {}
    for b, a in zip(before, after):
        if a["host_id"] in out or b["host_id"] != a["host_id"]:
            continue
        out[a["host_id"]] = delta(b, a)
    return out


def add_into(acc: dict[str, dict[str, int]], deltas: dict[str, dict[str, int]]) -> None:
    """Sum per-host deltas into `acc` (host id -> counts)."""
    for h, d in deltas.items():
        row = acc.setdefault(h, dict.fromkeys(KEYS, 0))
        for k, v in d.items():
            row[k] += v


def phases(starts: list[dict], first: list[dict], steps: dict, before_ckpt: list[dict],
           after_ckpt: list[dict]) -> dict[str, dict[str, dict[str, int]]]:
    """Phase -> host id -> bytes, from gathered snapshots: at worker start, as update 1
    starts, around the checkpoint; `steps` is the update windows already summed."""
    return {"startup": per_host_delta(starts, first), "steps": steps,
            "checkpoint": per_host_delta(before_ckpt, after_ckpt), "total": per_host_delta(starts, after_ckpt)}


def ordered_labels(snapshots: list[dict]) -> list[str]:
    """Readable host labels in host-id order: the order of the per-host metrics' index."""
    by_id = {s["host_id"]: s["host"] for s in snapshots}
    return [by_id[h] for h in sorted(by_id)]


def phase_lines(wire: dict[str, dict[str, dict[str, int]]], snapshots: list[dict]) -> list[str]:
    """One line per phase and host, and one per phase over all hosts, for the log."""
    by_id = {s["host_id"]: s["host"] for s in snapshots}
    lines = []
    for phase, hosts in wire.items():
        rows = [(by_id.get(h, h), hosts[h]) for h in sorted(hosts)]
        rows.append(("all hosts", {k: sum(d[k] for d in hosts.values()) for k in KEYS}))
        for name, d in rows:
            lines.append(f"wire {phase:<10} {name}: tx {d['wire_tx']:,} rx {d['wire_rx']:,} "
                         f"loopback {d['lo_tx']:,} bytes")
    return lines


def gather(obj, world: int) -> list:
    """`obj` from every rank, on every rank (index = rank): how rank 0 learns the other
    hosts' counters. A collective: every rank must call it."""
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * world
    dist.all_gather_object(out, obj)
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
