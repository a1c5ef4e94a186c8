"""The preflight's figures (`gradshare.steps.preflight`), where the projection and the limits read
them in place of the declared ones, with provenance "measured on these hosts, preflight run <id>".

An arm's update on the measured hosts:

    t(arm, u) = compute x share + exchange(u)

    compute     one device's whole update: a one-process arm's measured median where it finished,
                else the projection's (GPU study) or `arms.expected_update_s` (CPU study)
    share       one rank's share of it (`gradshare.cost.share`): 1 for single; for the plan's
                two-process arms as the preflight timed it on these hosts (about 1/2 with a device a
                rank, more where the ranks share cores)
    exchange    a dense update: the preflight's median round of dense's own buckets all-reduced,
                at the sustained rate (its last window); a compressed update: PowerSGD's round

The go/no-go adds each arm's start-up (a finished arm's measured, else `arms.expected_startup_s`),
prices hosts and cross-zone bytes as the budget check does, and sets the whole against the
study's deadline and bound; the speed screen is projected at the first window's rate and at
the last's, so that a burst allowance that would run out shows as a range.
"""
from __future__ import annotations

import dataclasses

from gradshare.cost.accounting import host_price
from gradshare.cost.share import compute_share
from gradshare.cost.volume import GB, WIRE_OVERHEAD, arm_cross_zone_bytes, exchange_bytes, ring_factor
from gradshare.contract import speed


def summarize(plan, results: dict[str, dict]) -> dict:
    """The figures of every socket setting's probe (rank 0's result files, by setting), the
    fastest setting for the arms' own buffers, and the hosts'."""
    settings = {}
    for setting, r in results.items():
        link = r["link"]
        dense = link["dense"]
        settings[setting] = {
            "dense_Bps": dense["logical_Bps"], "dense_first_Bps": dense["first_window_Bps"],
            "dense_last_Bps": dense["last_window_Bps"], "dense_round_s": dense["round_s_median"],
            "dense_round_bytes": dense["bytes_per_round"], "capacity_Bps": link["capacity"]["logical_Bps"],
            "powersgd_round_s": (link.get("powersgd") or {}).get("round_s_median")}
    best = max(settings, key=lambda k: settings[k]["dense_last_Bps"])
    first = next(iter(results.values()))
    timed = next((r["compute"] for r in results.values() if r.get("compute")), {})  # the first setting's
    return {"backend": first["backend"], "world": first["world"], "settings": settings, "best": best,
            "compute": timed,
            "sustain_s": plan.preflight.sustain_s, "window_s": f"{plan.preflight.window_s:g} s",
            "clock_offset_s": first["clock_offset_s"],
            "ranks": [{"rank": x["rank"], **x["resources"], **{f"host_link_{k}": v for k, v in x["host_link"].items()}}
                      for x in first["ranks"]]}


def round_s(figures: dict, setting: str, rate: str = "last") -> tuple[float, float | None]:
    """(the dense buckets' round, the compressed buffers' round or None), seconds, at the setting's
    `last` (sustained) or `first` (burst) window rate."""
    f = figures["settings"][setting]
    dense = f["dense_round_bytes"] / f[f"dense_{rate}_Bps"]
    return dense, f["powersgd_round_s"]


def update_s(plan, arm: str, update: int, compute_s: float, figures: dict, setting: str | None = None,
             rate: str = "last") -> float:
    """One update of `arm` on the measured hosts (the module's formula)."""
    kind = plan.arm(arm)
    if not kind.is_ddp:
        return compute_s
    dense, compressed = round_s(figures, setting or figures["best"], rate)
    exchange = kind.method.link_round_s(kind, update, dense, compressed)
    return compute_s * compute_share(plan, arm, figures)[0] + exchange


def arm_seconds(plan, arm: str, compute_s: float, figures: dict, updates: int | None = None, rate: str = "last") -> float:
    """The arm's updates, all or its last `updates`, in seconds."""
    n = plan.schedule.updates
    first = n - (n if updates is None else updates) + 1
    return sum(update_s(plan, arm, u, compute_s, figures, rate=rate) for u in range(first, n + 1))


def provenance(figures: dict) -> str:
    return f"measured on these hosts, preflight run {figures['run_id']}"


def link_gbit(figures: dict) -> float:
    """The measured link, Gbit/s each way per host, as `infra.link_gbit` means it: the best
    setting's sustained all-reduce of dense's buckets, in wire bits (a ring's per-rank share,
    TCP/IP headers included)."""
    f = figures["settings"][figures["best"]]
    return f["dense_last_Bps"] * ring_factor(figures["world"]) * WIRE_OVERHEAD * 8 / 1e9


def plan_with(plan, figures: dict) -> tuple[object, str]:
    """The plan with the preflight's figures in place of the declared link and host link, and the
    provenance line that says so."""
    infra = {"link_gbit": link_gbit(figures)}
    both = [x["host_link_both_GBps"] for x in figures["ranks"] if "host_link_both_GBps" in x]
    if both:
        infra["host_pinned_both_gbps"] = min(both)
    line = (f"{provenance(figures)}: link {infra['link_gbit']:.3g} Gbit/s each way (sockets {figures['best']}, "
            f"the last {figures.get('window_s', 'window')} of its sustained all-reduce)"
            + (f", host link {infra['host_pinned_both_gbps']:.1f} GB/s both ways" if both else
               ", host link declared (no GPU measured)"))
    return dataclasses.replace(plan, infra=dataclasses.replace(plan.infra, **infra)), line


def compute_s(plan, finished: dict) -> tuple[float, str]:
    """One device's whole update: a one-process arm's (kind `single`) measured median, from the
    study's FINISHED runs (`StudyFigures.finished`), or the plan's figure."""
    for arm in plan.one_process_arms():
        for run in finished[arm]:
            if run.median_step_s is not None:
                return run.median_step_s, f"the {arm} arm's measured median (run {run.run_id})"
    return plan.arms.expected_update_s, "the plan's arms.expected_update_s (no one-process arm finished yet)"


def go_no_go(plan, figures: dict, known, startup_s: float, now: float, spent_usd: float) -> dict:
    """Hours and dollars of the arms not yet done, on the hosts the preflight measured (`figures`),
    against the deadline and the budget; the speed screen projected at the burst and at the
    sustained rate. `known` (`StudyFigures`): the arms done, the one-process arm's measured update,
    the model's shapes and the study's start. `figures["per_update"]`, where set: each arm's
    seconds per update from the GPU projection with the measured figures (`projection.for_plan(...,
    figures=)`: compression and the host error's copies counted), in place of this module's
    compute-plus-exchange."""
    c, c_source = compute_s(plan, known.finished)
    per_update = figures.get("per_update")
    price = host_price(plan)
    exchange = exchange_bytes(plan, known.shapes)
    done_arms = known.done
    rows, total_s, total_usd = [], 0.0, 0.0
    for arm in plan.arms.names:
        if arm in done_arms:
            continue
        hosts = plan.arms.processes(arm)
        seconds = startup_s + (per_update[arm] * plan.schedule.updates if per_update and arm in per_update
                               else arm_seconds(plan, arm, c, figures))
        cross = arm_cross_zone_bytes(plan, arm, exchange)
        usd = hosts * seconds * price / 3600 + cross / GB * plan.infra.cross_zone_usd_per_gb
        rows.append({"arm": arm, "seconds": seconds, "usd": usd, "cross_zone_GB": cross / GB})
        total_s, total_usd = total_s + seconds, total_usd + usd
    deadline = known.start_epoch + plan.infra.deadline_hours * 3600
    fits_deadline = now + total_s <= deadline
    fits_budget = spent_usd + total_usd <= plan.infra.budget_usd
    speed_at = {}
    cand, base = plan.arms.candidate, plan.screen.speed_baseline
    if cand != base and {cand, base} <= set(plan.arms.names):
        # every arm trains the same tokens: tokens per second go as one over the arm's seconds
        for rate in ("first", "last"):
            speed_at[rate] = speed.screen(plan, {a: 1 / arm_seconds(plan, a, c, figures, rate=rate)
                                                 for a in (cand, base)})
        if per_update and {cand, base} <= set(per_update):  # the GPU projection's, one rate
            speed_at["first"] = speed_at["last"] = speed.screen(plan, {a: 1 / per_update[a] for a in (cand, base)})
    passes = {s.passes for s in speed_at.values()}
    speed_ratio = {rate: s.ratio for rate, s in speed_at.items()}
    if speed_at:
        speed_ratio["verdict"] = "uncertain" if len(passes) > 1 else "pass" if passes == {True} else "fail"
    why = []
    if not fits_deadline:
        why.append(f"the arms' {total_s / 3600:.2f} h would end past the deadline ({plan.infra.deadline_hours:g} h "
                   f"from the study's start)")
    if not fits_budget:
        why.append(f"${spent_usd:.2f} spent + ${total_usd:.2f} projected is past the ${plan.infra.budget_usd:g} bound")
    return {"go": "go" if not why else "no-go", "why": why, "arms": rows, "hours": total_s / 3600, "usd": total_usd,
            "spent_usd": spent_usd, "compute_s": c, "compute_source": c_source, "speed_ratio": speed_ratio,
            "speed_arms": [cand, base],
            "quality": "not projectable before training: the screen needs the arms' models",
            "provenance": provenance(figures) if "run_id" in figures else "measured now"}


def metrics(figures: dict) -> dict[str, float]:
    """Every figure as a metric with its unit in its name (`preflight/...`)."""
    out = {}
    for setting, f in figures["settings"].items():
        pre = f"preflight/sockets_{setting}"
        out |= {f"{pre}/dense_MBps": f["dense_Bps"] / 1e6, f"{pre}/dense_first_window_MBps": f["dense_first_Bps"] / 1e6,
                f"{pre}/dense_last_window_MBps": f["dense_last_Bps"] / 1e6, f"{pre}/dense_round_s": f["dense_round_s"],
                f"{pre}/capacity_MBps": f["capacity_Bps"] / 1e6}
        if f["powersgd_round_s"] is not None:
            out[f"{pre}/powersgd_round_s"] = f["powersgd_round_s"]
    timed = figures.get("compute") or {}
    out |= {f"preflight/compute_{k}": timed[k] for k in ("share", "alone_s", "rank_s") if k in timed}
    for r, off in enumerate(figures["clock_offset_s"]):
        out[f"preflight/rank{r}/clock_offset_s"] = off
    for x in figures["ranks"]:
        pre = f"preflight/rank{x['rank']}"
        out[f"{pre}/host_available_GB"] = x["host_available_bytes"] / 1e9
        out[f"{pre}/outbox_free_GB"] = x["outbox_free_bytes"] / 1e9
        for k in ("gpu_free_bytes", "gpu_cap_bytes"):
            if k in x:
                out[f"{pre}/{k.replace('_bytes', '_GB')}"] = x[k] / 1e9
        for k in ("h2d_GBps", "d2h_GBps", "both_GBps"):
            if f"host_link_{k}" in x:
                out[f"{pre}/host_link_{k}"] = x[f"host_link_{k}"]
    if figures.get("upload"):
        out |= {"preflight/upload_MBps": figures["upload"]["Bps"] / 1e6,
                "preflight/checkpoint_upload_s": figures["upload"]["checkpoint_s"]}
    g = figures.get("go_no_go") or {}
    if g:
        out |= {"preflight/projected_hours": g["hours"], "preflight/projected_usd": g["usd"]}
        out |= {f"preflight/speed_ratio_{k}_window": v for k, v in g["speed_ratio"].items() if k != "verdict"}
    return out


def table(figures: dict) -> str:
    """One screen: each socket setting's rates, the hosts, the go/no-go."""
    lines = [f"### Preflight: {figures['go_no_go']['go'].upper()} (backend {figures['backend']}, "
             f"{figures['world']} ranks; best sockets {figures['best']})", "",
             "| sockets | dense MB/s (first / last window) | dense round s | capacity MB/s | PowerSGD round s |",
             "|---|---|---|---|---|"]
    for s, f in figures["settings"].items():
        psgd = "-" if f["powersgd_round_s"] is None else f"{f['powersgd_round_s']:.4f}"
        lines.append(f"| {s} | {f['dense_Bps'] / 1e6:,.2f} ({f['dense_first_Bps'] / 1e6:,.2f} / "
                     f"{f['dense_last_Bps'] / 1e6:,.2f}) | {f['dense_round_s']:.3f} | {f['capacity_Bps'] / 1e6:,.2f} | {psgd} |")
    lines += ["", "| rank | host | memory free GB | outbox disk free GB | clock offset s | host link GB/s (both) |",
              "|---|---|---|---|---|---|"]
    for x in figures["ranks"]:
        off = figures["clock_offset_s"][x["rank"]] if x["rank"] < len(figures["clock_offset_s"]) else 0.0
        link = x.get("host_link_both_GBps")
        lines.append(f"| {x['rank']} | {x['host']} | {x['host_available_bytes'] / 1e9:.1f} | "
                     f"{x['outbox_free_bytes'] / 1e9:.1f} | {off:+.4f} | {'-' if link is None else f'{link:.1f}'} |")
    g = figures["go_no_go"]
    timed = figures.get("compute") or {}
    if timed.get("share"):
        lines += ["", f"One rank's share of an update: {timed['share']:.2f} of one device's whole update "
                      + (f"({timed['rank_s']:.3f} s against {timed['alone_s']:.3f} s; {timed['source']})."
                         if "rank_s" in timed else f"({timed['source']}).")]
    lines += ["", f"Projected ({g['provenance']}; compute {g['compute_s']:.3f} s/update, {g['compute_source']}): "
              f"{g['hours']:.2f} h, ${g['usd']:.2f} for the arms to run"
              + "".join(f"; {r['arm']} {r['seconds']:.0f} s ${r['usd']:.2f}" for r in g["arms"]) + "."]
    if g["speed_ratio"]:
        s = g["speed_ratio"]
        cand, base = g["speed_arms"]
        lines.append(f"Speed screen: {s['verdict']} ({cand} over {base}: {s['first']:.2f} at the first window's rate, "
                     f"{s['last']:.2f} at the last's). Quality screen: {g['quality']}.")
    if figures.get("upload"):
        u = figures["upload"]
        lines.append(f"Tracking server: {u['Bps'] / 1e6:,.0f} MB/s to its artifact store; the checkpoint in about "
                     f"{u['checkpoint_s']:.0f} s. Guard's stop permission: {figures['stop_permission']}.")
    if g["why"]:
        lines.append("No-go: " + "; ".join(g["why"]) + ".")
    return "\n".join(lines) + "\n"
