"""A study's own machine, its two-process arms re-projected to other link rates and host counts
from their measurements: how the emulated hosts' runs check the projection's link term
(`benchmarks/link_rates.py`), and the report's *this study's machine* table.

    t(single)    = c1
    t(arm, W, R) = c1 x s + x(arm) + wire_bytes_per_rank(B(arm), W) x 8 / R

    c1      the single arm's median seconds per update
    s       one rank's share of an update's documents in the plan's two-process arms, 1/2, kept for
            every W (weak scaling: W hosts train W/2 x the documents of an update)
    x(arm)  what the arm's own median seconds per update leave after c1 x s and the exchange the
            model gives for the link it ran over (`link_rate_mbit`: the emulated rate, or `inf`)
    B(arm)  its median logical bytes per update after warm-up

An arm measured over loopback never crossed a link: it is shown at loopback and two hosts only,
never extrapolated to links or host counts it did not cross. Latency is not modelled (the
emulated link has none). The study's hosts, from the prepared workload and GPU figures, are
`gradshare.projection`.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from gradshare.cost import host_price
from gradshare.wire import GB, cross_zone_bytes, wire_bytes_per_rank

TWO_HOST_SHARE = 0.5  # one rank's share of an update in the plan's two-process arms
DEFAULT_HOSTS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ArmInputs:
    extra_s: float
    """x(arm): seconds per update beyond compute and link."""
    logical_bytes: float
    """B(arm): one rank's logical bytes per update, post warm-up."""


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


def exchange_s(logical_bytes: float, world: int, rate_mbit: float) -> float:
    """Seconds one rank's ring all-reduce of `logical_bytes` takes on a link of `rate_mbit`."""
    if world <= 1 or math.isinf(rate_mbit):
        return 0.0
    return wire_bytes_per_rank(logical_bytes, world) * 8 / (rate_mbit * 1e6)


def s_per_update(m: Machine, arm: str, world: int, rate_mbit: float) -> float:
    if arm == "single":
        return m.single_s
    a = m.arms[arm]
    return m.single_s * TWO_HOST_SHARE + a.extra_s + exchange_s(a.logical_bytes, world, rate_mbit)


def project(m: Machine, arm: str, world: int, rate_mbit: float, train_docs: int, docs_per_update: int) -> dict:
    """Every figure of one arm on `world` hosts over a link of `rate_mbit`."""
    world = 1 if arm == "single" else world
    t = s_per_update(m, arm, world, rate_mbit)
    share = 1.0 if arm == "single" else TWO_HOST_SHARE
    docs_per_step = docs_per_update * share * world
    updates = train_docs / docs_per_step
    speed = (world * share / t) / (1 / m.single_s)
    gpu_s = updates * t * world
    cross_bytes = 0.0 if world == 1 else cross_zone_bytes(m.arms[arm].logical_bytes, world) * updates
    usd = gpu_s / 3600 * m.usd_per_host_hour + cross_bytes / GB * m.cross_zone_usd_per_gb
    return {"arm": arm, "hosts": world, "rate_mbit": rate_mbit, "s_per_update": t, "updates": updates,
            "tokens_per_s": m.tokens_per_update * share * world / t, "speed_ratio": speed, "gpu_s": gpu_s,
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
    [(update, bytes)], "link_rate_mbit": "22" | "inf" | ...}`; `single` must be among them."""
    if "single" not in arms:
        raise ValueError("a projection from measurements needs the single arm (one device's update)")
    skip = max(plan.powersgd.warmup_updates, 2)  # warm-up, and DDP's bucket rebuild at update 2
    c1 = _median_after(arms["single"]["step_s"], 2)
    measured = {"single": c1}
    inputs, rates = {}, set()
    for arm, got in arms.items():
        if arm == "single":
            continue
        rate = _rate(got.get("link_rate_mbit"))
        if rate is None:
            continue  # a real network of unknown rate: its x cannot be separated from its link
        rates.add(rate)
        t = _median_after(got["step_s"], skip)
        b = _median_after(got["logical_bytes"], skip)
        measured[arm] = t
        inputs[arm] = ArmInputs(t - c1 * TWO_HOST_SHARE - exchange_s(b, 2, rate), b)
    single = arms["single"]
    tokens = (statistics.median(t * dict(single["step_s"])[step] for step, t in single["tokens_per_s"]
                                if step in dict(single["step_s"]))
              if single.get("tokens_per_s") else plan.schedule.docs_per_update * plan.data.max_doc_tokens)
    i = plan.infra
    return Machine(name=name, single_s=c1, tokens_per_update=tokens, usd_per_host_hour=host_price(plan)[1],
                   cross_zone_usd_per_gb=i.cross_zone_usd_per_gb,
                   link_mbit=rates.pop() if len(rates) == 1 else float("nan"), arms=inputs,
                   source="medians of the study's measured seconds and logical bytes per update", measured_s=measured)


def from_study(study: str) -> tuple[object, Machine]:
    """The plan and the measured machine of a study's FINISHED arms, read through MLflow."""
    # MLflow, here only: a projection without a study needs no tracking store
    from gradshare import metrics as M
    from gradshare import store
    from gradshare import tracking as T

    _, plan = store.prepared_plan(study)
    c = T.client()
    arms = {}
    for arm in plan.arms.names:
        runs = T.search(study, "train", arm, status="FINISHED")
        if not runs:
            continue
        rid = runs[-1].info.run_id
        arms[arm] = {"step_s": [(m.step, m.value) for m in c.get_metric_history(rid, M.STEP_S)],
                     "tokens_per_s": [(m.step, m.value) for m in c.get_metric_history(rid, M.TOKENS_PER_S)],
                     "logical_bytes": [(m.step, m.value) for m in c.get_metric_history(rid, M.LOGICAL_BYTES)],
                     "link_rate_mbit": runs[-1].data.params.get("link_rate_mbit")}
    return plan, from_measurements(plan, arms, f"the machine study {study!r} ran on")


def grid(m: Machine, plan, hosts=DEFAULT_HOSTS, rates_mbit=None) -> list[dict]:
    rates = list(rates_mbit or [m.link_mbit])
    rows = [project(m, "single", 1, math.inf, plan.train_docs, plan.schedule.docs_per_update)]
    for arm in m.arms:
        looped = math.isinf(m.link_mbit)  # never crossed a link: shown as measured, not extrapolated
        for w in ((2,) if looped else hosts):
            for r in ((math.inf,) if looped else rates):
                row = project(m, arm, w, r, plan.train_docs, plan.schedule.docs_per_update)
                if w == 2 and r == m.link_mbit and arm in m.measured_s:
                    row["measured_s_per_update"] = m.measured_s[arm]
                rows.append(row)
    return rows


def _rate_text(r: float) -> str:
    if math.isinf(r):
        return "loopback"
    return f"{r / 1e3:g} Gbit/s" if r >= 1e3 else f"{r:g} Mbit/s"


def table(rows: list[dict]) -> str:
    out = ["| arm | hosts | link | s/update | speed ratio vs single (median s/update) | GPU-s | "
           "cross-zone GB | $ |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = f" (measured {r['measured_s_per_update']:.3f})" if "measured_s_per_update" in r else ""
        out.append(f"| {r['arm']} | {r['hosts']} | {_rate_text(r['rate_mbit'])} | {r['s_per_update']:.3f}{measured} | "
                   f"{r['speed_ratio']:.2f} | {r['gpu_s']:,.0f} | {r['cross_zone_bytes'] / GB:,.2f} | {r['usd']:.2f} |")
    return "\n".join(out)
