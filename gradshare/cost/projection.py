"""What the study's hosts would do, before anyone rents them: each arm's seconds per update, speed
ratio, GPU-seconds and dollars, and the break-even points of the speed and cost screens.

    gradshare project                      # the full profile's inputs, built here by prepare's code
    gradshare project --study S            # a prepared study's own workload, and its machine's runs
    gradshare project --json p.json --plot p.png

The model, per update u of the prepared schedule (`gradshare.inputs.workload`), on W hosts with one
GPU each in a ring over a link of R bit/s each way (latency not modelled):

    t(single, u)    = cost(single; padded tokens and micro-batches of one rank at world 1)
    t(arm, W, R, u) = cost(arm; the slower rank's at world 2) + wire_bytes_per_rank(B(arm, u), W) x 8 / R

    cost            `gradshare.cost.gpu_cost`: matrix work, gradient additions, clip and AdamW, the arm's
                    extra (PowerSGD: compression and the FP32 host error's copies), each measured on
                    one H200 and scaled to the plan's GPU by the rate it is bound by
    B(arm, u)       one rank's logical bytes (`gradshare.cost.volume`): dense every update; PowerSGD dense
                    in its warm-up updates, then its P, Q and uncompressed tensors
    W > 2           weak scaling: each rank keeps the two-rank share, so the study takes 2/W as many
                    updates

    speed ratio     tokens/s of the arm over the speed baseline's (`screen.speed_baseline`), over the
                    whole schedule, decided by `gradshare.contract.speed` as the verdict is
    GPU-seconds     W x the arm's seconds; cheaper = fewer than the baseline's (active, as the report)
    dollars         GPU-seconds x price per host-hour + cross-zone bytes x price per GB each way

Every input carries its provenance: prepared (the study's schedule), measured (the H200 call:
where, when, which commit) or declared (the plan, with its source). A study's own machine,
re-projected from its runs, is `gradshare.cost.link`.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from gradshare.contract import speed
from gradshare.contract.plan import load_plan
from gradshare.cost import gpu_cost, measured
from gradshare.cost import link as ML
from gradshare.cost.volume import (
    GB,
    cross_zone_bytes,
    exchange_bytes,
    wire_bytes_per_rank,
)
from gradshare.inputs.build import workload_of
from gradshare.inputs.workload import scaled
from gradshare.model.source import parameter_shapes


DEFAULT_HOSTS = ML.DEFAULT_HOSTS
PLOT_RATES_GBIT = (1, 2, 5, 10, 20, 50, 100, 200, 400)


class Hosts:
    """The study's hosts under one plan, workload and calibration."""

    def __init__(self, plan, record: dict, calibration: gpu_cost.Calibration, workload_source: str,
                 host_link_source: str = ""):
        self.plan = plan
        self.host_link_source = host_link_source or (
            f"declared: infra.host_pinned_both_gbps {plan.infra.host_pinned_both_gbps:g} GB/s both ways, "
            f"until a preflight measures it")
        self.record = record
        self.measured = calibration
        self.cost = calibration.scaled_to(gpu_cost.declared_gpu(plan))
        self.workload_source = workload_source
        self.exchange = exchange_bytes(plan, parameter_shapes(plan))
        self.dense_bytes, self.compressed_bytes = self.exchange.dense, self.exchange.compressed

    def logical_bytes(self, arm: str, update: int) -> float:
        return self.exchange.of(self.plan.arm(arm), update)

    def update_s(self, arm: str, update: int, row: dict, world: int, rate_mbit: float, cost=None) -> float:
        cost = cost or self.cost
        kind = self.plan.arm(arm)
        if not kind.is_ddp:
            return cost.seconds(kind, self.plan, row["w1"]["padded_tokens"], row["w1"]["micro_batches"])
        t = cost.seconds(kind, self.plan, row["w2"]["padded_tokens"], row["w2"]["micro_batches"], update)
        link = 0.0 if math.isinf(rate_mbit) else wire_bytes_per_rank(self.logical_bytes(arm, update), world) * 8 / (rate_mbit * 1e6)
        return t + link

    def arm(self, arm: str, world: int, rate_mbit: float, record: dict | None = None, cost=None) -> dict:
        """Every figure of one arm over the whole schedule."""
        record = record or self.record
        ddp = self.plan.arm(arm).is_ddp
        world = world if ddp else 1
        steps = 2 / world if ddp else 1.0  # weak scaling beyond the plan's two hosts
        ups = record["updates"]
        seconds = sum(self.update_s(arm, u, r, world, rate_mbit, cost) for u, r in enumerate(ups, start=1)) * steps
        tokens = sum(r["input_tokens"] for r in ups)
        cross = 0.0 if world == 1 else sum(cross_zone_bytes(self.logical_bytes(arm, u), world)
                                           for u in range(1, len(ups) + 1)) * steps
        gpu_s = seconds * world
        i = self.plan.infra
        return {"arm": arm, "hosts": world, "rate_mbit": rate_mbit, "s_per_update": seconds / (len(ups) * steps),
                "seconds": seconds, "tokens_per_s": tokens / seconds, "gpu_s": gpu_s, "cross_zone_bytes": cross,
                "usd": gpu_s / 3600 * i.usd_per_host_hour + cross / GB * i.cross_zone_usd_per_gb}

    def table(self, world: int = 2, rate_mbit: float | None = None, record=None, cost=None) -> list[dict]:
        rate = self.plan.infra.link_gbit * 1e3 if rate_mbit is None else rate_mbit
        rows = [self.arm(a, world, rate, record, cost) for a in self.plan.arms.names]
        tps = {r["arm"]: r["tokens_per_s"] for r in rows}
        base = next(r for r in rows if r["arm"] == self.plan.screen.speed_baseline)
        for r in rows:
            screen = speed.screen(self.plan, tps, r["arm"])
            r["speed_ratio"], r["speed_screen_passes"] = screen.ratio, screen.passes
            r["cheaper_than_baseline"] = r["gpu_s"] < base["gpu_s"]
        return rows

    def ratio(self, arm: str, world: int, rate_mbit: float, record=None, cost=None) -> float:
        """The speed screen's ratio of `arm` on `world` hosts over the baseline on as many (one,
        where the baseline is a one-process arm), both over the link of `rate_mbit`."""
        base = self.plan.screen.speed_baseline
        tps = {a: self.arm(a, world, rate_mbit, record, cost)["tokens_per_s"] for a in {arm, base}}
        return speed.screen(self.plan, tps, arm).ratio

    def gpu_s_ratio(self, arm: str, rate_mbit: float, record=None) -> float:
        base = self.plan.screen.speed_baseline
        return self.arm(arm, 2, rate_mbit, record)["gpu_s"] / self.arm(base, 2, rate_mbit, record)["gpu_s"]


def _solve(f, lo: float, hi: float, target: float) -> float | None:
    """x in [lo, hi] (log-bisected) where the increasing f(x) reaches target; None where it never does."""
    if f(hi) < target:
        return None
    if f(lo) >= target:
        return lo
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return hi


def break_even(h: Hosts, arm: str | None = None) -> dict:
    """Where the screens would flip for `arm` on the plan's two hosts: the link rate (at the study's
    documents) and the document length (at the plan's link) at which the speed screen passes, and
    the document length at which it uses fewer GPU-seconds than the speed baseline. None: not within 1 Mbit/s
    to 100 Tbit/s, or documents 1/20 to 200 times as long. `arm`: the plan's candidate where None."""
    arm = arm or h.plan.arms.candidate
    need = h.plan.screen.speed_ratio
    link = h.plan.infra.link_gbit * 1e3
    tokens = h.record["median"]["input_tokens"]
    speed_link = _solve(lambda r: h.ratio(arm, 2, r), 1.0, 1e8, need)
    speed_k = _solve(lambda k: h.ratio(arm, 2, link, scaled(h.record, k)), 0.05, 200.0, need)
    cost_k = _solve(lambda k: 1 / h.gpu_s_ratio(arm, link, scaled(h.record, k)), 0.05, 200.0, 1.0)
    return {"speed_screen": need, "link_mbit_for_speed": speed_link,
            "tokens_per_update_for_speed": speed_k and speed_k * tokens,
            "tokens_per_update_for_fewer_gpu_s": cost_k and cost_k * tokens,
            "ratio_at_infinite_link": h.ratio(arm, 2, math.inf)}


def sensitivity(h: Hosts, arm: str | None = None) -> dict:
    """The verdicts (speed screen passed, cheaper than the baseline) of `arm` (the plan's candidate
    where None) with the host link's pinned rate `infra.host_pinned_uncertainty` below and above
    the declared figure."""
    arm = arm or h.plan.arms.candidate
    u, link = h.plan.infra.host_pinned_uncertainty, h.plan.infra.link_gbit * 1e3
    out = {}
    for label, f in (("low", 1 - u), ("declared", 1.0), ("high", 1 + u)):
        cost = replace(h.cost, gpu=replace(h.cost.gpu, pinned_both_gbps=h.cost.gpu.pinned_both_gbps * f))
        rows = {r["arm"]: r for r in h.table(2, link, cost=cost)}
        out[label] = {"pinned_both_gbps": cost.gpu.pinned_both_gbps, "speed_ratio": rows[arm]["speed_ratio"],
                      "speed_screen_passes": rows[arm]["speed_screen_passes"],
                      "cheaper": rows[arm]["cheaper_than_baseline"]}
    verdicts = {(v["speed_screen_passes"], v["cheaper"]) for v in out.values()}
    out["flips"] = len(verdicts) > 1
    return out


def provenance(h: Hosts) -> list[str]:
    m, c, i = h.record["median"], h.measured, h.plan.infra
    return [f"prepared: {h.workload_source}; a median of {m['input_tokens']:,.0f} input tokens per update, "
            f"{m['w1_padded_tokens']:,.0f} padded in {m['w1_micro_batches']:g} micro-batches on one GPU, "
            f"{m['w2_padded_tokens']:,.0f} in {m['w2_micro_batches']:g} on the slower of two ({h.record['layout']})",
            f"measured: {c.gpu.source}; {c.source}; largest check error "
            f"{max(abs(v['error']) for v in c.checks.values()):.1%}",
            f"declared: {h.cost.gpu.source} (each with its source in gradshare/plan.py); link "
            f"{i.link_gbit:g} Gbit/s each way (infra.link_gbit); ${i.usd_per_host_hour:g} per host-hour, "
            f"${i.cross_zone_usd_per_gb:g} per GB each way",
            f"model: {h.dense_bytes / GB:.2f} GB dense and {h.compressed_bytes / GB:.3f} GB compressed logical "
            f"bytes per rank and update, from the model's shapes"]


def compute(plan, record: dict, workload_source: str, calibration: gpu_cost.Calibration | None = None,
            hosts=DEFAULT_HOSTS, host_link_source: str = "") -> dict:
    """Everything `gradshare project` prints and the report shows, as plain JSON."""
    h = Hosts(plan, record, calibration or gpu_cost.load(), workload_source, host_link_source)
    m = record["median"]
    shape = {a.name: (m["w2_padded_tokens"], m["w2_micro_batches"]) if a.is_ddp
             else (m["w1_padded_tokens"], m["w1_micro_batches"]) for a in plan.arm_list()}
    per_update = {a.name: h.cost.parts(a, plan, *shape[a.name]) for a in plan.arm_list()}
    details = {a.name: a.method.cost_details(h.cost, a, plan, *shape[a.name]) for a in plan.arm_list()}
    copies = {name: d | {"host_link_gbps": h.cost.gpu.pinned_both_gbps} for name, d in details.items() if d}
    curves = [{"arm": a.name, "hosts": w, "rate_mbit": g * 1e3, "speed_ratio": h.ratio(a.name, w, g * 1e3),
               "compressed": a.method.compresses_gradient}
              for a in plan.arm_list() if a.is_ddp for w in hosts for g in PLOT_RATES_GBIT]
    return {"machine": f"{len(plan.infra.hosts)} x {plan.infra.instance_type} ({plan.infra.gpu}), a projection",
            "link_mbit": plan.infra.link_gbit * 1e3, "rows": h.table(), "parts_s": per_update,
            "error_copies": copies, "host_link_source": h.host_link_source,
            "break_even": break_even(h, plan.arms.candidate), "sensitivity": sensitivity(h, plan.arms.candidate),
            "curves": curves,
            "provenance": provenance(h), "speed_screen": plan.screen.speed_ratio,
            "candidate": plan.arms.candidate, "baseline": plan.screen.speed_baseline,
            "baseline_one_process": not plan.arm(plan.screen.speed_baseline).is_ddp}


def verdict_lines(p: dict) -> list[str]:
    """The projection's answer in sentences: the verdict, the break-even points, the uncertainty."""
    rows = {r["arm"]: r for r in p["rows"]}
    cand, base = p["candidate"], p["baseline"]
    out = []
    if cand in rows and cand != base:
        r, need = rows[cand], p["speed_screen"]
        out.append(f"{cand} on the plan's hosts: speed ratio {r['speed_ratio']:.2f} over {base} (the screen needs "
                   f"{need:.2f}): {'passes' if r['speed_screen_passes'] else 'fails'}; "
                   f"{'fewer' if r['cheaper_than_baseline'] else 'more'} GPU-seconds than {base} "
                   f"({r['gpu_s']:,.0f} against {rows[base]['gpu_s']:,.0f}).")
        b = p["break_even"]
        link = (f"at a link of {_rate(b['link_mbit_for_speed'])} each way" if b["link_mbit_for_speed"]
                else f"at no link rate (even an infinite one gives {b['ratio_at_infinite_link']:.2f})")
        out.append(f"Break-even: the speed screen would pass {link}, or, at the plan's link, with "
                   + (f"{b['tokens_per_update_for_speed']:,.0f} tokens per update" if b["tokens_per_update_for_speed"]
                      else "no document length within 200 times the study's")
                   + f"; {cand} would use fewer GPU-seconds than {base} with "
                   + (f"{b['tokens_per_update_for_fewer_gpu_s']:,.0f} tokens per update."
                      if b["tokens_per_update_for_fewer_gpu_s"] else
                      "no document length within 200 times the study's"
                      + (" (two GPUs, each doing half of single's matrix work, use at least single's GPU-seconds, "
                         "and each adds its own optimizer and exchange)." if p.get("baseline_one_process") else ".")))
        s = p["sensitivity"]
        out.append(("The verdict flips within the host link's uncertainty: " if s["flips"] else
                    "The verdict holds within the host link's uncertainty: ")
                   + ", ".join(f"at {v['pinned_both_gbps']:.0f} GB/s both ways speed ratio {v['speed_ratio']:.2f}"
                               for k, v in s.items() if k != "flips") + ".")
    return out


def _rate(mbit: float | None) -> str:
    if mbit is None or math.isinf(mbit):
        return "loopback"
    return f"{mbit / 1e3:.3g} Gbit/s" if mbit >= 1e3 else f"{mbit:.3g} Mbit/s"


def markdown(p: dict) -> str:
    lines = [f"**The study's hosts**: {p['machine']}, two hosts in two zones over {_rate(p['link_mbit'])}:", "",
             f"| arm | s/update | speed ratio vs {p['baseline']} | GPU-s | cheaper than {p['baseline']} | "
             "cross-zone GB | $ |",
             "|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        lines.append(f"| {r['arm']} | {r['s_per_update']:.3f} | {r['speed_ratio']:.2f} | {r['gpu_s']:,.0f} | "
                     f"{'-' if r['arm'] == p['baseline'] else ('yes' if r['cheaper_than_baseline'] else 'no')} | "
                     f"{r['cross_zone_bytes'] / GB:,.1f} | {r['usd']:.2f} |")
    parts = "; ".join(f"{a}: " + ", ".join(f"{k} {v:.3f}" for k, v in ps.items()) for a, ps in p["parts_s"].items())
    copies = "; ".join(f"{a}: the error up and down {c['copies_s']:.3f} s, beside compute {c['covered_s']:.3f} s, "
                       f"exposed {c['exposed_s']:.3f} s" for a, c in p.get("error_copies", {}).items())
    lines += ["", *verdict_lines(p), "", f"Seconds per update by part, the median update (before the link): {parts}.",
              *(["", f"PowerSGD's FP32 host error per compressed update and rank: {copies}; host link "
                     f"{p['host_link_source']}."] if copies else []),
              "", "Inputs:", *[f"- {x}" for x in p["provenance"]]]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> Path:
    """Speed ratio against link rate, 2 to 64 hosts, with the screen's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    counts = sorted({c["hosts"] for c in p["curves"]})
    colour = {w: plt.cm.viridis(k / max(1, len(counts) - 1)) for k, w in enumerate(counts)}  # one per host count
    arms = list(dict.fromkeys((c["arm"], c.get("compressed", c["arm"] == p["candidate"])) for c in p["curves"]))
    for k, (arm, compressed) in enumerate(arms):  # solid: a compressing arm, dotted: plain all-reduce
        for w in counts:
            pts = [(c["rate_mbit"] / 1e3, c["speed_ratio"]) for c in p["curves"] if c["arm"] == arm and c["hosts"] == w]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "-" if compressed else ":", color=colour[w], marker="os^vD"[k % 5], markersize=3,
                        label=f"{arm}, {w} hosts")
    ax.axhline(p["speed_screen"], color="grey", linestyle="--", linewidth=0.8, label="speed screen")
    ax.axvline(p["link_mbit"] / 1e3, color="grey", linestyle=":", linewidth=0.8, label="plan's link")
    ax.set_xscale("log")
    ax.set_xlabel("link, Gbit/s each way")
    ax.set_ylabel(f"speed ratio vs {p['baseline']}")
    ax.set_title("Projected speed on the study's hosts (solid: PowerSGD, dotted: plain all-reduce)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def full_shape(plan):
    """The study's hosts' plan for a study of another profile: its infra, arms and powersgd, the
    full profile's model, data and schedule (a tiny study's hosts are the study's too)."""

    if plan.study.profile == "full":
        return plan
    full = load_plan("full", {})
    return replace(full, infra=plan.infra, screen=plan.screen,
                   arms=replace(full.arms, rows=plan.arms.rows, candidate=plan.arms.candidate,
                                controls=plan.arms.controls),
                   powersgd=replace(full.powersgd, rank=plan.powersgd.rank, fold_errors=plan.powersgd.fold_errors))


def full_profile_workload(log=print) -> tuple[object, dict]:
    """The full profile's plan and workload, its inputs built here with prepare's own code (seconds:
    tasks, conversations, tokenizer, schedule; no model, no MLflow), or kept from an earlier build
    of the same plan by the same code (`gradshare.util.kept`)."""
    plan = load_plan("full", {})
    record = workload_of(plan, log=log)
    log(f"[gradshare] the full profile's inputs, built here by prepare's code: a median of "
        f"{record['median']['input_tokens']:,.0f} input tokens per update")
    return plan, record


def for_plan(plan, record: dict | None = None, log=print, hosts=DEFAULT_HOSTS, figures: dict | None = None) -> dict:
    """The projection of a study's hosts: its recorded workload (`record`, where it is a full-profile
    study that recorded one: `tracking.figures.study_workload`), else the full profile's, built here
    by prepare's code. `figures`: the study's preflight (`gradshare.cost.measured`), whose link and
    host link replace the declared ones."""
    source = "the study's prepared schedule (inputs/workload.json)"
    if record is None:
        _, record = full_profile_workload(log)
        source = "the full profile's inputs, built here by prepare's code"
    shaped = full_shape(plan)
    line, host_link = None, ""
    if figures is not None:
        shaped, line = measured.plan_with(shaped, figures)
        if any("host_link_both_GBps" in x for x in figures["ranks"]):
            host_link = (f"measured by the preflight ({measured.provenance(figures)}): the slowest host, "
                         f"{shaped.infra.host_pinned_both_gbps:.1f} GB/s both ways")
    out = compute(shaped, record, source, hosts=hosts, host_link_source=host_link)
    if line:  # the declared line names the link and host link no more: they are the measured above
        declared = f"link {shaped.infra.link_gbit:g} Gbit/s each way (infra.link_gbit)"
        out["provenance"] = [line] + [x.replace(declared, "link: measured, above") for x in out["provenance"]]
    return out


def gpu_per_update(plan, record: dict | None, figures: dict) -> dict[str, float] | None:
    """Each arm's seconds per update from the GPU projection (of the study's recorded workload
    `record`, as `for_plan`) with the measured link and host link (a GPU study); None on CPUs,
    where the projection's GPU figures say nothing."""
    if plan.hardware.device != "cuda":
        return None
    rows = for_plan(plan, record, log=lambda *a: None, figures=figures)["rows"]
    return {r["arm"]: r["s_per_update"] for r in rows}
