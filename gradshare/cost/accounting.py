"""Cost of an arm: GPU-seconds, host-hours and dollars at the plan's price, wire bytes
per host, cross-zone dollars, checkpoint seconds; and the study's budget and deadline.

Prices and bounds come from the plan (`gradshare.contract.hosts_plan.InfraPlan`), never from here. A CPU run (the
tiny profile's emulation) is priced as the CPU host it ran on (`infra.cpu_host`); what
the same host-hours would cost on the study's hosts is shown beside it as a projection
only (`usd_on_study_hosts`). Cross-zone
transfer is billed in each direction: bytes a host sends to, and receives from, a
host in another zone each cost `cross_zone_usd_per_gb`.
"""
from __future__ import annotations

from gradshare.contract import metrics as M
from gradshare.cost.volume import GB, cross_zone_bytes


def hosts_for(plan, arm: str) -> int:
    """Planned hosts of an arm: one GPU per host (g6e.2xlarge carries one L40S)."""
    return plan.arms.processes(arm)


def priced_as(plan) -> tuple[str, float]:
    """What the arms' hosts are priced as, and at how many dollars per host-hour: the CPU host for
    an emulated run, else the study's."""
    i = plan.infra
    return (i.cpu_host, i.cpu_usd_per_host_hour) if plan.emulated else (i.instance_type, i.usd_per_host_hour)


def host_price(plan) -> float:
    """Dollars per host-hour of the arms' hosts (`priced_as`)."""
    return priced_as(plan)[1]


def arm_cost(plan, arm: str, metrics: dict, measured_hosts: list[str]) -> dict:
    """Cost figures of one FINISHED arm from its train run's summary metrics."""
    infra = plan.infra
    n_hosts = hosts_for(plan, arm)
    wall = max(metrics.get(M.WALL_S, 0.0), 0.0)  # a duration: never negative, whatever a clock did
    host_hours = wall * n_hosts / 3600
    per_host = []
    for j, name in enumerate(measured_hosts):  # whole arm: worker start to end (metering's `total`)
        per_host.append({"host": name, "wire_tx_bytes": metrics.get(M.host_wire_tx_total(j), 0.0),
                         "wire_rx_bytes": metrics.get(M.host_wire_rx_total(j), 0.0),
                         "loopback_bytes": metrics.get(M.host_loopback_total(j), 0.0)})
    zones = set(infra.zones[:n_hosts])
    # Only traffic between distinct physical hosts in distinct zones crosses a zone.
    crosses = len(measured_hosts) > 1 and len(zones) > 1
    cross_bytes = sum(h["wire_tx_bytes"] + h["wire_rx_bytes"] for h in per_host) if crosses else 0.0
    logical = metrics.get(M.LOGICAL_BYTES_TOTAL, 0.0)
    projected = cross_zone_bytes(logical, n_hosts) if len(zones) > 1 else 0.0
    return {
        "gpu_s_active": metrics.get(M.GPU_S_ACTIVE, 0.0),
        "gpu_s_total": metrics.get(M.GPU_S_TOTAL, 0.0),
        "wall_s": wall,
        "hosts": n_hosts,
        "host_hours": host_hours,
        "usd": host_hours * host_price(plan),
        "usd_on_study_hosts": host_hours * infra.usd_per_host_hour,
        "wire_per_host": per_host,
        "physical_hosts_measured": len(measured_hosts),
        "cross_zone_bytes": cross_bytes,
        "cross_zone_usd": cross_bytes / GB * infra.cross_zone_usd_per_gb,
        "cross_zone_usd_projected_from_logical": projected / GB * infra.cross_zone_usd_per_gb,
        "logical_bytes": logical,
        "logical_bytes_post_warmup": metrics.get(M.LOGICAL_BYTES_POST_WARMUP, 0.0),
        "checkpoint_s": metrics.get(M.CKPT_SAVE_S, 0.0),
        "checkpoint_bytes": metrics.get(M.CKPT_BYTES, 0.0),
    }


def study_budget(plan, costs: dict[str, dict]) -> dict:
    usd = sum(c["usd"] + c["cross_zone_usd"] for c in costs.values() if c)
    hours = sum(c["wall_s"] for c in costs.values() if c) / 3600
    return {"usd": usd, "budget_usd": plan.infra.budget_usd, "within_budget": usd <= plan.infra.budget_usd,
            "hours": hours, "deadline_hours": plan.infra.deadline_hours,
            "within_deadline": hours <= plan.infra.deadline_hours,
            "price": {"usd_per_host_hour": host_price(plan), "date": plan.infra.price_date,
                      "instance_type": priced_as(plan)[0], "emulated": plan.emulated,
                      "study_usd_per_host_hour": plan.infra.usd_per_host_hour,
                      "study_instance_type": plan.infra.instance_type}}


def cost_words(candidate: dict | None, baseline: dict | None, speed_ratio: float | None,
               baseline_arm: str) -> str:
    """Whether the candidate reduced cost or only time against the speed screen's baseline arm,
    in words. The plan: "faster execution with more total GPU time is not a cost reduction":
    cheaper is decided on total GPU-seconds (start-up and checkpoint included); active
    GPU-seconds are shown beside them."""
    if not candidate or not baseline or speed_ratio is None:
        return "not decided: an arm it needs is missing"
    total = candidate["gpu_s_total"] / max(baseline["gpu_s_total"], 1e-12)
    active = candidate["gpu_s_active"] / max(baseline["gpu_s_active"], 1e-12)
    b = baseline_arm
    figures = f"{total:.2f}x {b}'s total GPU-seconds ({active:.2f}x its active ones)"
    faster = speed_ratio > 1
    if faster and total < 1:
        return f"the candidate reduced cost: {speed_ratio:.2f}x {b}'s throughput with {figures}"
    if faster:
        return (f"the candidate reduced time only: {speed_ratio:.2f}x {b}'s throughput but {figures}, "
                f"so it is not a cost reduction")
    if total < 1:
        return f"the candidate reduced cost only: {speed_ratio:.2f}x {b}'s throughput with {figures}"
    return f"the candidate reduced neither: {speed_ratio:.2f}x {b}'s throughput with {figures}"
