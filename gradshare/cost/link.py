"""A study's own machine, its two-process arms re-projected to other link rates and host counts
from their measurements: how the emulated hosts' runs check the projection's link term
(`benchmarks/link_rates.py`), and the report's *this study's machine* table.

    t(one-process arm) = c1
    t(arm, W, R)       = c1 x s + x(arm) + wire_bytes_per_rank(B(arm), W) x 8 / (R x e(arm))

    c1      the one-process arm's (kind `single`) median seconds per update
    s       one rank's share of an update's documents in the plan's two-process arms, 1/2, kept for
            every W (weak scaling: W hosts train W/2 x the documents of an update)
    x(arm)  what the arm's own median seconds per update leave after c1 x s and the exchange the
            model gives for the link it ran over (`link_rate_mbit`: the emulated rate, or `inf`)
    B(arm)  its median logical bytes per update after warm-up
    e(arm)  the link's efficiency for the arm's exchange: 1 unless the arm was measured twice, over
            loopback (which gives x) and across a link (which gives e, `with_link_efficiency`).
            TCP on a shaped link carries a large all-reduce below its rate (slow start after each
            idle compute phase; 0.86-0.90 for the tiny dense arm), while an arm whose exchange
            overlaps its backward shows e above 1; with one measurement per arm, x absorbs both

An arm measured over loopback never crossed a link: it is shown at loopback and two hosts only,
never extrapolated to links or host counts it did not cross. Latency is not modelled (the
emulated link has none). The study's hosts, from the prepared workload and GPU figures, are
`gradshare.cost.projection`.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from gradshare.contract import speed
from gradshare.cost.accounting import host_price
from gradshare.cost.share import work_share
from gradshare.cost.volume import GB, cross_zone_bytes, wire_bytes_per_rank

# s: one rank's documents in the plan's two-process arms, kept for every W; what the arm's own
# cores or devices add over that share is in x(arm), measured
TWO_HOST_SHARE = work_share(2)
DEFAULT_HOSTS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ArmInputs:
    extra_s: float
    """x(arm): seconds per update beyond compute and link."""
    logical_bytes: float
    """B(arm): one rank's logical bytes per update, post warm-up."""
    link_efficiency: float = 1.0
    """e(arm): measured seconds of the model's exchange / seconds the arm's exchange took."""


@dataclass(frozen=True)
class Machine:
    name: str
    single_s: float
    """c1: one device, one whole update."""
    tokens_per_update: float
    usd_per_host_hour: float
    cross_zone_usd_per_gb: float
    link_mbit: float
    """The link the machine's own two-process arms had (inf: loopback)."""
    arms: dict[str, ArmInputs] = field(default_factory=dict)
    source: str = ""
    measured_s: dict[str, float] = field(default_factory=dict)
    """Median seconds per update as measured, where the inputs came from runs."""
    one_process: str = "single"
    """The name of the arm measured as c1: one device, one whole update."""


def exchange_s(logical_bytes: float, world: int, rate_mbit: float, efficiency: float = 1.0) -> float:
    """Seconds one rank's ring all-reduce of `logical_bytes` takes on a link of `rate_mbit` that
    carries it at `efficiency` of its rate."""
    if world <= 1 or math.isinf(rate_mbit):
        return 0.0
    return wire_bytes_per_rank(logical_bytes, world) * 8 / (rate_mbit * 1e6 * efficiency)


def s_per_update(m: Machine, arm: str, world: int, rate_mbit: float) -> float:
    if arm == m.one_process:
        return m.single_s
    a = m.arms[arm]
    return m.single_s * TWO_HOST_SHARE + a.extra_s + exchange_s(a.logical_bytes, world, rate_mbit, a.link_efficiency)


def project(m: Machine, arm: str, world: int, rate_mbit: float, train_docs: int, docs_per_update: int) -> dict:
    """Every figure of one arm on `world` hosts over a link of `rate_mbit`."""
    solo = arm == m.one_process
    world = 1 if solo else world
    t = s_per_update(m, arm, world, rate_mbit)
    share = 1.0 if solo else TWO_HOST_SHARE
    docs_per_step = docs_per_update * share * world
    updates = train_docs / docs_per_step
    gpu_s = updates * t * world
    cross_bytes = 0.0 if world == 1 else cross_zone_bytes(m.arms[arm].logical_bytes, world) * updates
    usd = gpu_s / 3600 * m.usd_per_host_hour + cross_bytes / GB * m.cross_zone_usd_per_gb
    return {"arm": arm, "hosts": world, "rate_mbit": rate_mbit, "s_per_update": t, "updates": updates,
            "tokens_per_s": m.tokens_per_update * share * world / t, "gpu_s": gpu_s,
            "cross_zone_bytes": cross_bytes, "usd": usd}


def _median_after(history: list[tuple[int, float]], after: int) -> float:
    values = [v for step, v in history if step > after] or [v for _, v in history]
    return statistics.median(values)


def _rate(text: str | None) -> float | None:
    try:
        return float(text)  # "inf" reads as infinity
    except (TypeError, ValueError):
        return None


def from_measurements(plan, arms: dict[str, dict], name: str) -> Machine:
    """A machine from measured arms: `arms[arm] = {"step_s": [(update, s)], "logical_bytes":
    [(update, bytes)], "link_rate_mbit": "22" | "inf" | ...}`; a one-process arm (kind `single`)
    must be among them."""
    solo = next((a for a in plan.one_process_arms() if a in arms), None)
    if solo is None:
        raise ValueError("a projection from measurements needs a one-process arm (kind single: one device's update)")
    c1 = _median_after(arms[solo]["step_s"], 2)
    measured = {solo: c1}
    inputs, rates = {}, set()
    for arm, got in arms.items():
        if not plan.arm(arm).is_ddp:
            continue
        rate = _rate(got.get("link_rate_mbit"))
        if rate is None:
            continue  # a real network of unknown rate: its x cannot be separated from its link
        rates.add(rate)
        t = _median_after(got["step_s"], _skip(plan, arm))
        b = _median_after(got["logical_bytes"], _skip(plan, arm))
        measured[arm] = t
        inputs[arm] = ArmInputs(t - c1 * TWO_HOST_SHARE - exchange_s(b, 2, rate), b)
    single = arms[solo]
    tokens = (statistics.median(t * dict(single["step_s"])[step] for step, t in single["tokens_per_s"]
                                if step in dict(single["step_s"]))
              if single.get("tokens_per_s") else plan.schedule.docs_per_update * plan.data.max_doc_tokens)
    i = plan.infra
    return Machine(name=name, single_s=c1, tokens_per_update=tokens, usd_per_host_hour=host_price(plan),
                   cross_zone_usd_per_gb=i.cross_zone_usd_per_gb,
                   link_mbit=rates.pop() if len(rates) == 1 else float("nan"), arms=inputs,
                   source="medians of the study's measured seconds and logical bytes per update", measured_s=measured,
                   one_process=solo)


def _skip(plan, arm: str) -> int:
    """The updates of `arm` its medians leave out: its PowerSGD warm-up, and DDP's bucket rebuild at update 2."""
    return max(plan.arm(arm).warmup_updates, 2)


def with_link_efficiency(m: Machine, plan, arms: dict[str, dict]) -> Machine:
    """`m` (from loopback runs: c1 and x) with each arm's link efficiency fitted from the same arm
    measured across a link (`arms[arm]` as in `from_measurements`, with its `link_rate_mbit`):
    e = the model's exchange seconds / (measured seconds - c1 x s - x). Fitted at one rate, the
    machine is then a prediction at every other rate, never a check of the rate it was fitted on."""
    if not math.isinf(m.link_mbit):
        raise ValueError("a link efficiency is fitted on a machine measured over loopback (its x free of any link)")
    fitted, measured, rates = dict(m.arms), dict(m.measured_s or {}), set()
    for arm, got in arms.items():
        rate = _rate(got.get("link_rate_mbit"))
        if arm not in m.arms or rate is None or math.isinf(rate):
            continue
        a = m.arms[arm]
        t = _median_after(got["step_s"], _skip(plan, arm))  # as `from_measurements` reads the loopback runs
        link_s = t - m.single_s * TWO_HOST_SHARE - a.extra_s
        if link_s <= 0:
            raise ValueError(f"{arm} at {rate:g} Mbit/s took {t:.3f} s, no more than over loopback: "
                             "no link time to fit an efficiency on")
        fitted[arm] = ArmInputs(a.extra_s, a.logical_bytes, exchange_s(a.logical_bytes, 2, rate) / link_s)
        measured[arm] = t
        rates.add(rate)
    if len(rates) != 1:
        raise ValueError(f"fit the link efficiency on one link rate, got {sorted(rates) or 'none'}")
    return Machine(name=m.name, single_s=m.single_s, tokens_per_update=m.tokens_per_update,
                   usd_per_host_hour=m.usd_per_host_hour, cross_zone_usd_per_gb=m.cross_zone_usd_per_gb,
                   link_mbit=rates.pop(), arms=fitted, measured_s=measured, one_process=m.one_process,
                   source=m.source + "; each arm's link efficiency fitted on its run across the link")


def with_speed_ratio(m: Machine, plan, row: dict) -> dict:
    """`row` (of `project`) with its speed ratio over the plan's speed baseline, as
    `gradshare.contract.speed` takes it: the baseline on as many hosts over the same link, or, for a
    one-process row, on the plan's two hosts over this machine's link. None where the baseline did
    not run."""
    base = plan.screen.speed_baseline
    if base != m.one_process and base not in m.arms:
        return row
    hosts, rate = (row["hosts"], row["rate_mbit"]) if row["hosts"] > 1 else (2, m.link_mbit)
    tps = {row["arm"]: row["tokens_per_s"],
           base: project(m, base, hosts, rate, plan.train_docs, plan.schedule.docs_per_update)["tokens_per_s"]}
    return row | {"speed_ratio": speed.screen(plan, tps, row["arm"]).ratio}


def grid(m: Machine, plan, hosts=DEFAULT_HOSTS, rates_mbit=None) -> list[dict]:
    rates = list(rates_mbit or [m.link_mbit])
    rows = [with_speed_ratio(m, plan, project(m, m.one_process, 1, math.inf, plan.train_docs,
                                                plan.schedule.docs_per_update))]
    for arm in m.arms:
        looped = math.isinf(m.link_mbit)  # never crossed a link: shown as measured, not extrapolated
        for w in ((2,) if looped else hosts):
            for r in ((math.inf,) if looped else rates):
                row = with_speed_ratio(m, plan, project(m, arm, w, r, plan.train_docs, plan.schedule.docs_per_update))
                if w == 2 and r == m.link_mbit and arm in m.measured_s:
                    row["measured_s_per_update"] = m.measured_s[arm]
                rows.append(row)
    return rows


def _rate_text(r: float) -> str:
    if math.isinf(r):
        return "loopback"
    return f"{r / 1e3:g} Gbit/s" if r >= 1e3 else f"{r:g} Mbit/s"


def table(rows: list[dict], baseline: str) -> str:
    out = [f"| arm | hosts | link | s/update | speed ratio vs {baseline} (median s/update) | GPU-s | "
           "cross-zone GB | $ |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = f" (measured {r['measured_s_per_update']:.3f})" if "measured_s_per_update" in r else ""
        out.append(f"| {r['arm']} | {r['hosts']} | {_rate_text(r['rate_mbit'])} | {r['s_per_update']:.3f}{measured} | "
                   f"{r.get('speed_ratio', math.nan):.2f} | {r['gpu_s']:,.0f} | {r['cross_zone_bytes'] / GB:,.2f} | {r['usd']:.2f} |")
    return "\n".join(out)
