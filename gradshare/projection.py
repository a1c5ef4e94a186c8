"""Projected seconds per update, speed ratio, GPU-seconds and dollars of each arm, on the
study's hosts or on the machine a study ran on, for any number of hosts and link rate.

    gradshare project                        # the study's hosts (full profile's plan)
    gradshare project --study gradshare-tiny # also that study's machine, from its measured arms
    gradshare project --study S --hosts 2,4,8 --rates-mbit 11,22,44 --json out.json

The model (one update; W hosts with one device each, in a ring, each with a link of R bit/s
in each direction; latency is not modelled, as the emulated link has none):

    t(single)  = c1
    t(arm, W, R) = c1 x s + x(arm) + B(arm) x 2 (W-1)/W x o x 8 / R

    c1      one device's seconds for one whole update of the plan (`schedule.docs_per_update`)
    s       one rank's share of that update's documents; the share of the plan's two-host
            arms, 1/2, is kept for every W (weak scaling: W hosts train W/2 x the documents of
            an update, so the study's 4,096 documents take 2/W as many updates)
    x(arm)  the arm's own seconds beyond compute and link: DDP's bucket copies (dense), the
            compression and error feedback (powersgd)
    B(arm)  logical bytes one rank hands to the exchange per update, post warm-up (for
            PowerSGD its P and Q and the uncompressed tensors; `logical_bytes_per_exchange`)
    o       wire bytes per payload byte: 1514 on the wire per 1448 of TCP payload at MTU 1500
            (Ethernet 14 + IP 20 + TCP with timestamps 32 bytes of headers)
    2(W-1)/W  what a ring all-reduce sends (and receives) per rank, in units of B

    speed ratio   = tokens/s(arm) / tokens/s(single) = (W x s / t(arm)) / (1 / c1)
    GPU-seconds   = updates(W) x t x W     (active; start-up and checkpoint not included)
    cross-zone    = every ring hop joins two zones (hosts alternate between the plan's two):
                    each host sends and receives B x 2(W-1)/W x o per update, each direction
                    billed at `infra.cross_zone_usd_per_gb`
    dollars       = GPU-seconds / 3600 x price per host-hour + cross-zone bytes x price

Inputs come from one of two places:
- the study's hosts (`study_hosts`): c1 from the plan's L40S rate and utilisation at 6 x
  parameters FLOP per token over full-length documents, x(dense) = 0, x(powersgd) =
  `infra.powersgd_extra_s` (measured on an H200), B from the full model's shapes, R from
  `infra.link_gbit`: declared figures, so a projection, never a measurement;
- a study that ran (`measured`): c1 = the single arm's median seconds per update; for each
  two-process arm, B its median logical bytes per update after warm-up, and x what its own
  median seconds per update leave after c1 x s and the exchange the model gives for the
  link it ran over (`link_rate_mbit`: the emulated rate, or `inf` over loopback). Measured
  over loopback, x is the arm's cost with no link at all, so projecting it to a shaped link
  checks the model's link term (`benchmarks/link_rates.py`).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

WIRE_OVERHEAD = 1514 / 1448
TWO_HOST_SHARE = 0.5  # one rank's share of an update in the plan's two-process arms
GB = 1e9
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
    return logical_bytes * 2 * (world - 1) / world * WIRE_OVERHEAD * 8 / (rate_mbit * 1e6)


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
    sent = 0.0 if world == 1 else m.arms[arm].logical_bytes * 2 * (world - 1) / world * WIRE_OVERHEAD
    cross_bytes = 2 * sent * world * updates  # every host's sent and received bytes
    usd = gpu_s / 3600 * m.usd_per_host_hour + cross_bytes / GB * m.cross_zone_usd_per_gb
    return {"arm": arm, "hosts": world, "rate_mbit": rate_mbit, "s_per_update": t, "updates": updates,
            "tokens_per_s": m.tokens_per_update * share * world / t, "speed_ratio": speed, "gpu_s": gpu_s,
            "cross_zone_bytes": cross_bytes, "usd": usd}


# --- inputs -----------------------------------------------------------------------------

MODEL_SHAPES = "model_shapes.json"  # prepare's record of parameter_shapes(plan), an artifact of its run


def parameter_shapes(plan) -> list[tuple[int, ...]]:
    """The plan's model's trainable parameter shapes, from its config on the meta device
    (no weights are made)."""
    import torch

    from gradshare.model import model_config

    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(model_config(plan.model.config, plan.model.vocab_size))
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def study_hosts(plan) -> Machine:
    """The study's hosts from the plan's declared figures (see the module docstring)."""
    from gradshare.train.powersgd import logical_bytes_per_exchange

    shapes = parameter_shapes(plan)
    params = sum(math.prod(s) for s in shapes)
    tokens = plan.schedule.docs_per_update * plan.data.max_doc_tokens
    i = plan.infra
    c1 = 6 * params * tokens / (i.gpu_dense_tflops * 1e12 * i.gpu_utilisation)
    p = plan.powersgd
    arms = {"dense": ArmInputs(0.0, logical_bytes_per_exchange(shapes, 4, None)),
            "powersgd": ArmInputs(i.powersgd_extra_s,
                                  logical_bytes_per_exchange(shapes, 4, p.rank, p.min_compression_rate))}
    return Machine(name=f"{i.instance_type} ({i.gpu}), declared", single_s=c1, tokens_per_update=tokens,
                   usd_per_host_hour=i.usd_per_host_hour, cross_zone_usd_per_gb=i.cross_zone_usd_per_gb,
                   link_mbit=i.link_gbit * 1e3, arms=arms,
                   source=f"{params:,} parameters, {tokens:,} tokens per update at 6 FLOP per parameter "
                          f"and token, {i.gpu_dense_tflops:g} TFLOP/s x {i.gpu_utilisation:g}; powersgd "
                          f"+{i.powersgd_extra_s:g} s per update")


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
    from gradshare.cost import host_price

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


# --- tables -----------------------------------------------------------------------------

def grid(m: Machine, plan, hosts=DEFAULT_HOSTS, rates_mbit=None) -> list[dict]:
    rates = list(rates_mbit or [m.link_mbit])
    rows = [project(m, "single", 1, math.inf, plan.train_docs, plan.schedule.docs_per_update)]
    for arm in m.arms:
        for w in hosts:
            for r in rates:
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
    out = ["| arm | hosts | link | s/update | speed ratio vs single | GPU-s (study's documents) | "
           "cross-zone GB | $ |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = f" (measured {r['measured_s_per_update']:.3f})" if "measured_s_per_update" in r else ""
        out.append(f"| {r['arm']} | {r['hosts']} | {_rate_text(r['rate_mbit'])} | {r['s_per_update']:.3f}{measured} | "
                   f"{r['speed_ratio']:.2f} | {r['gpu_s']:,.0f} | {r['cross_zone_bytes'] / GB:,.2f} | {r['usd']:.2f} |")
    return "\n".join(out)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected numbers separated by commas, got {text!r}") from None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="gradshare project", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", help="also project the machine this study ran on, from its measured arms")
    ap.add_argument("--profile", default="full", help="plan of the study's hosts without --study (default full)")
    ap.add_argument("--hosts", default=",".join(map(str, DEFAULT_HOSTS)), help="host counts, e.g. 2,4,8")
    ap.add_argument("--rates-gbit", default="5,10,20,50,100", help="study hosts' link rates, Gbit/s")
    ap.add_argument("--rates-mbit", default="", help="the measured machine's link rates, Mbit/s "
                                                      "(default: the rate its arms ran over)")
    ap.add_argument("--json", help="also write every row to this file")
    args = ap.parse_args(argv)
    hosts = [int(h) for h in _floats(args.hosts)]
    if any(h < 2 for h in hosts):
        raise SystemExit("--hosts: a two-process arm needs at least 2 hosts")
    out = {}
    if args.study:
        plan, measured = from_study(args.study)
        rates = _floats(args.rates_mbit) or [measured.link_mbit]
        out["measured"] = {"machine": measured.name, "source": measured.source, "rows": grid(measured, plan, hosts, rates)}
        print(f"## {measured.name} ({measured.source})\n\n" + table(out["measured"]["rows"]) + "\n")
        plan_for_hosts = full_shape(plan)
    else:
        from gradshare.plan import load_plan

        plan_for_hosts = load_plan(args.profile, {})
    hosts_m = study_hosts(plan_for_hosts)
    rows = grid(hosts_m, plan_for_hosts, hosts, [r * 1e3 for r in _floats(args.rates_gbit)])
    out["study_hosts"] = {"machine": hosts_m.name, "source": hosts_m.source, "rows": rows}
    print(f"## {hosts_m.name}, a projection ({hosts_m.source})\n\n" + table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=lambda x: str(x)))


def full_shape(plan):
    """The study's hosts' plan for a study of another profile: its infra and powersgd, the
    full profile's model, data and schedule (a tiny study's hosts are the study's too)."""
    from gradshare.plan import load_plan

    if plan.study.profile == "full":
        return plan
    full = load_plan("full", {})
    from dataclasses import replace

    return replace(full, infra=plan.infra, powersgd=replace(full.powersgd, rank=plan.powersgd.rank))


if __name__ == "__main__":
    main()
