"""Before a two-host arm trains: a short probe of the link its ranks exchange over, and a refusal
where the rate it measures could not carry the arm within its bounds (no attempt used).

    check_link(plan, arm, params, rank, world, device, log)   # every rank, after the model loads

Every rank all-reduces `PROBE_BYTES` blocks until `PROBE_MAX_BYTES` have crossed or `PROBE_S`
passed (at least one block): at 22 Mbit/s about half a second, at 1 Mbit/s two. Rank 0's rate
is every rank's (broadcast), so all decide alike. With the arm's own exchange (`cost.volume`, the
bytes of every update on the wire), the arm is refused where one update's exchange alone would
outlast the hang bound (`arms.hang_s`: the arm would end as hung), or all of them the part of the
arm's time limit given to updates. The reason starts `link:` (`LINK_REFUSAL`): the train step
makes it a refusal, KILLED, no attempt used (`train.outcome`).

Only where the arm crosses hosts (its launcher's world larger than one host's ranks): on one
host nothing is probed.
"""
from __future__ import annotations

import os
import time

from gradshare.cost.volume import exchange_bytes, ring_factor, wire_bytes_per_rank

LINK_REFUSAL = "link:"
PROBE_BYTES = 128 * 1024  # one all-reduce of the probe (FP32)
PROBE_MAX_BYTES = 1 << 20
PROBE_S = 2.0


class LinkTooSlow(RuntimeError):
    """The probe's rate cannot carry the arm within its bounds: a refusal, no attempt used."""


def crosses_hosts() -> bool:
    """Whether this rank's arm spans hosts (torch elastic's world larger than this host's)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def probe_rate(device, world: int) -> tuple[float, int, float]:
    """(bytes a second one rank sent, bytes sent, seconds): ring all-reduces of `PROBE_BYTES`
    blocks; rank 0's figures for every rank."""
    import torch
    import torch.distributed as dist

    block = torch.ones(PROBE_BYTES // 4, dtype=torch.float32, device=device)
    dist.all_reduce(block)  # the connections made before the clock starts
    sent, t0 = 0.0, time.perf_counter()
    while True:
        dist.all_reduce(block)
        sent += PROBE_BYTES * ring_factor(world)
        elapsed = time.perf_counter() - t0
        if sent >= PROBE_MAX_BYTES or elapsed >= PROBE_S:
            break
    figures = torch.tensor([sent / elapsed, sent, elapsed], dtype=torch.float64, device=device)
    dist.broadcast(figures, src=0)
    rate, sent, elapsed = figures.tolist()
    return rate, int(sent), elapsed


def verdict(plan, arm: str, update_wire_bytes: list[float], rate_Bps: float) -> str | None:
    """The refusal's reason where `rate_Bps` (bytes a second one rank sends) cannot carry the
    arm's exchanges (`update_wire_bytes`: one rank's wire bytes at each update) within its bounds;
    None where it can. Compute is not counted: the link alone decides."""
    a, updates = plan.arms, plan.schedule.updates
    worst = max(update_wire_bytes, default=0.0)
    per_update_s = worst / rate_Bps
    total_s = sum(update_wire_bytes) / rate_Bps
    budget_s = updates * a.expected_update_s * a.timeout_margin
    mbit = rate_Bps * 8 / 1e6
    if per_update_s > a.hang_s():
        return (f"{LINK_REFUSAL} the link to the other host carries {mbit:.2f} Mbit/s (a probe before the arm); "
                f"arm {arm}'s largest update sends {worst / 1e6:.2f} MB a rank, {per_update_s:.0f} s at that rate, "
                f"past the {a.hang_s():.0f} s within which an update must end (arms.hang_updates x "
                f"arms.expected_update_s): the arm would end as hung. Nothing was trained, no attempt used: "
                f"mend the link, or raise arms.expected_update_s at prepare")
    if total_s > budget_s:
        return (f"{LINK_REFUSAL} the link to the other host carries {mbit:.2f} Mbit/s (a probe before the arm); "
                f"arm {arm}'s {updates} updates send {sum(update_wire_bytes) / 1e6:.1f} MB a rank, {total_s:.0f} s "
                f"at that rate, past the {budget_s:.0f} s its time limit gives its updates ({updates} x "
                f"arms.expected_update_s {a.expected_update_s:g} x arms.timeout_margin {a.timeout_margin:g}). "
                f"Nothing was trained, no attempt used: mend the link, or raise arms.expected_update_s at prepare")
    return None


def check_link(plan, arm: str, shapes: list[tuple[int, ...]], device, world: int, log) -> None:
    """Probe the link and refuse the arm (`LinkTooSlow`) where it cannot carry it; on one host, nothing."""
    if world < 2 or not crosses_hosts():
        return
    rate, sent, elapsed = probe_rate(device, world)
    exchange = exchange_bytes(plan, shapes)
    row = plan.arm(arm)
    wire = [wire_bytes_per_rank(exchange.of(row, u), world) for u in range(1, plan.schedule.updates + 1)]
    log(f"[{arm}] link probe: {rate * 8 / 1e6:.2f} Mbit/s ({sent / 1e6:.2f} MB a rank in {elapsed:.2f} s)")
    if (why := verdict(plan, arm, wire, rate)) is not None:
        raise LinkTooSlow(why)
