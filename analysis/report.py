"""The report: the verdict table for the terminal, `report.md`, a self-contained
`report.html` (the same Markdown rendered by python-markdown, plots embedded as data
URIs), and the plots as PNG files.

Plots: per-family accuracy with normal intervals; one per per-update metric that
`gradshare.contract.metrics.PER_UPDATE` marks for a plot (loss curves, throughput, cumulative
logical and wire bytes); each arm's loss gap to the one-process arm; the projected speed ratio.
"""
from __future__ import annotations

import base64
import html
import math
import re
from itertools import accumulate
from pathlib import Path

from analysis.collect import StudyRecord
from analysis.preconditions import screen_word
from gradshare.contract import metrics as M
from gradshare.cost import projection as P


def _fmt(x, spec=".3f", none="—"):
    return none if x is None else format(x, spec)


def _cell(text) -> str:
    """Free text (a failure reason) as one table cell: a bare `|` would split it."""
    return "" if text is None else str(text).replace("|", "\\|")


def _pp(x):
    return "—" if x is None else f"{100 * x:+.2f}"


def _paired_cells(p: dict) -> tuple[str, ...] | None:
    """mean, se, lo, hi in percentage points and McNemar's p, formatted once for both tables."""
    if p["mean"] is None:
        return None
    return _pp(p["mean"]), f"{100 * p['se']:.2f}", _pp(p["lo"]), _pp(p["hi"]), f"{p['mcnemar']['p']:.4f}"


# Every reason is printed once: in the verdict table's row of the model it belongs to. Wherever
# else that model is missing (a pair, a screen, the cost, the projection), it is named with its
# status, not its reason again (analyze once printed a failed arm's reason seven times).
def _named(v: dict, models) -> str:
    return ", ".join(f"{m} {v['arms'].get(m, {}).get('status', 'missing')}" for m in models)


def _no_data(v: dict, models: list[str], reason: str | None) -> str:
    """Why a row has no figures: the models without scores, by name (their reasons are above)."""
    unscored = [m for m in models if (v["arms"].get(m) or {}).get("accuracy") is None]
    return f"no data: {_named(v, unscored)}" if unscored else (reason or "no data")


def _screen_reason(v: dict, screen: dict) -> str:
    """An undecided screen's reason: the arms it lacks by name where their rows give the reason,
    in full where no row does (e.g. too many attempts of a finished arm); or its own reason."""
    if not screen.get("missing"):
        return screen.get("reason") or ""
    parts = [_named(v, [arm]) if (v["arms"].get(arm) or {}).get("failure_reason") else f"{arm}: {why}"
             for arm, why in screen["missing"].items()]
    return "missing: " + "; ".join(parts)


def verdict_table(v: dict) -> str:
    """Plain-text verdict table for the terminal: each reason once, in its model's row."""
    lines = [f"gradshare verdicts — study {v['study']}  plan {v['plan_sha256'][:12]}  z={v['z']}"]
    if v.get("emulation"):
        lines.append(v["emulation"])
    lines.append("")
    lines.append(f"{'model':<10}{'status':<12}{'overall acc':>12}{'retention NLL':>15}  reason")
    for m in v["arms"]:
        a = v["arms"].get(m, {})
        acc = (a.get("accuracy") or {}).get("overall")
        lines.append(f"{m:<10}{a.get('status', '?'):<12}{_fmt(acc):>12}{_fmt(a.get('retention_nll'), '.4f'):>15}"
                     f"  {a.get('failure_reason') or ''}")
    lines += ["", f"{'paired change (pp)':<20}{'mean':>8}{'se':>8}{'lo':>8}{'hi':>8}{'McNemar p':>11}"]
    for k in v["pairs"]:
        cells = _paired_cells(v[k])
        if cells is None:
            lines.append(f"{k:<20}{'—':>8}  {_no_data(v, k.split('-'), v[k].get('reason'))}")
        else:
            mean, se, lo, hi, p = cells
            lines.append(f"{k:<20}{mean:>8}{se:>8}{lo:>8}{hi:>8}{p:>11}")
    q, s = v["quality_screen"], v["speed_screen"]
    undecided = {name: f"  ({_screen_reason(v, sc)})" if sc["pass"] is None else "" for name, sc in (("q", q), ("s", s))}
    lines += ["", f"quality screen: {screen_word(q).upper()}{undecided['q']}"]
    for name, c in (q.get("checks") or {}).items():
        lines.append(f"  {name:<24} {_word(c['pass']):<5} " + ", ".join(
            f"{k}={v_:.4g}" for k, v_ in c.items() if k != "pass"))
    lines.append(f"speed screen:   {screen_word(s).upper()}" + (
        f"  ratio {s['ratio']:.3f} (threshold {s['threshold']})" if s["pass"] is not None else undecided["s"]))
    lines += [f"  note: {n}" for n in q.get("notes", []) + [n for n in s.get("notes", []) if n not in q.get("notes", [])]]
    lines.append(f"cost: {s['cost_words']}")
    b = v["budget"]
    p = b["price"]
    lines.append(f"budget: ${b['usd']:.4f} of ${b['budget_usd']:.0f}; {b['hours']:.3f} h of {b['deadline_hours']:.0f} h "
                 f"(priced as {p['instance_type']}, ${p['usd_per_host_hour']}/host-hour, {p['date']})")
    if p.get("emulated"):
        study_usd = sum(c["usd_on_study_hosts"] for c in v["cost"].values() if c)
        lines.append(f"projection only: the same host-hours on the study's {p['study_instance_type']} hosts "
                     f"would cost ${study_usd:.4f} (but CPU speed says nothing of their speed)")
    return "\n".join(lines)


def _word(p):
    return {True: "PASS", False: "FAIL", None: "null"}[p]


def plots(rec: StudyRecord, v: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    z = v["z"]
    paths = []
    fams = list(rec.plan.data.families) + ["overall"]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.2
    for i, m in enumerate(v["arms"]):
        if m not in rec.scores:
            continue
        acc = v["arms"][m]["accuracy"]
        n = {f: sum(1 for r in rec.scores[m]["test"] if r["family"] == f) for f in fams[:-1]}
        n["overall"] = len(rec.scores[m]["test"])
        ys = [acc[f] for f in fams]
        err = [z * math.sqrt(max(y * (1 - y), 0) / n[f]) for y, f in zip(ys, fams)]
        ax.bar([j + (i - (len(v["arms"]) - 1) / 2) * width for j in range(len(fams))], ys, width, yerr=err, capsize=2, label=m)
    ax.set_xticks(range(len(fams)), [f.replace("_", "\n") for f in fams], fontsize=8)
    ax.set_ylabel(f"accuracy (± {z}·se)")
    ax.set_title("Final-test accuracy by family")
    _legend(ax)
    paths.append(_save(fig, out / "accuracy_by_family.png"))

    for m in M.PER_UPDATE:
        if m.plot is not None:
            paths.append(_per_update(rec, m, out, plt))
    paths.append(_loss_gap(rec, out, plt))
    if "study_hosts" in (v.get("projection") or {}):
        paths.append(_projected_speed(v, out))
    return paths


def _per_update(rec: StudyRecord, m: M.PerUpdate, out: Path, plt) -> Path:
    """One per-update metric's plot (`m.plot`): a line per arm, and the metric it names `beside`
    dashed for the arms of more than one process."""
    p = m.plot
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for arm, a in rec.arms.items():
        _history_line(ax, a.histories.get(m.name), p.cumulative, label=arm)
    for arm, a in rec.arms.items():
        if p.beside and a.histories.get(p.beside) and rec.plan.arm(arm).is_ddp:
            _history_line(ax, a.histories[p.beside], p.cumulative, label=f"{arm} ({p.beside})", linestyle="--")
    ax.set_xlabel("update")
    ax.set_ylabel(m.unit)
    ax.set_title(p.title)
    _legend(ax)
    return _save(fig, out / p.file)


def _history_line(ax, history, cumulative: bool, **style) -> None:
    """A history [(update, value)] as a line, its running sum where `cumulative`; none if empty."""
    if not history:
        return
    xs, ys = zip(*history)
    ax.plot(xs, list(accumulate(ys)) if cumulative else ys, **style)


def _projected_speed(v: dict, out: Path) -> Path:
    """Projected speed ratio on the study's hosts against the link rate, 2-64 hosts, with the screen."""
    return P.plot(v["projection"]["study_hosts"], out / "projected_speed_ratio.png")


def _loss_gap(rec: StudyRecord, out: Path, plt) -> Path:
    """Each arm's loss minus the one-process arm's (kind `single`: one device, the reference every
    other arm's function equals), update by update: where the curves overlap, the gap shows."""
    fig, ax = plt.subplots(figsize=(8, 3))
    ref = next(iter(rec.plan.one_process_arms()), None)
    base = dict(rec.arms[ref].histories.get(M.TRAIN_LOSS) or []) if ref in rec.arms else {}
    for arm, a in rec.arms.items():
        h = a.histories.get(M.TRAIN_LOSS) or []
        pts = [(u, y - base[u]) for u, y in h if u in base]
        if pts and arm != ref:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=f"{arm} − {ref}")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("update")
    ax.set_ylabel("nats")
    ax.set_title(f"Training loss gap to the {ref} arm" if base else "Training loss gap (no one-process arm finished)")
    _legend(ax)
    return _save(fig, out / "loss_gap_to_single.png")


def _legend(ax) -> None:
    """A legend where the plot has labelled lines (an arm without data draws none): matplotlib
    warns "No artists with labels found" on an empty one."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def markdown(rec: StudyRecord, v: dict, plot_paths: list[Path]) -> str:
    fams = list(rec.plan.data.families)
    md = [f"# gradshare report — study `{v['study']}`", "",
          f"plan_sha256 `{v['plan_sha256']}`, z = {v['z']}, candidate `{v['candidate']}`, "
          f"controls {', '.join(v['controls'])}, seed model: `{v['seed_model']}`", ""]
    if v["seed_model"].startswith("random-"):
        md += ["> **Randomly initialised seed model: throughput work only. No quality verdict applies.**", ""]
    if v.get("emulation"):
        where = ("the two-process arms' ranks shared one GPU over gloo" if v["emulation"].startswith("rehearsal")
                 else "the arms ran as CPU processes on one machine")
        md += [f"> **{v['emulation'][0].upper() + v['emulation'][1:]}.** {where[0].upper() + where[1:]}; their "
               f"times and dollars describe that machine. The study's hosts appear only as a projection.", ""]
    md += _links(v, rec.plan)
    md += ["## Verdicts", "", "```", verdict_table(v), "```", "", "## Accuracy by family", "",
           "(A model's reason, where it has one, is in the verdict table above.)", "",
           "| model | status | " + " | ".join(fams) + " | overall | retention NLL (nats) |",
           "|" + "---|" * (len(fams) + 4)]
    for m in v["arms"]:
        a = v["arms"].get(m, {})
        acc = a.get("accuracy") or {}
        md.append(f"| {m} | {a.get('status')} | " + " | ".join(_fmt(acc.get(f)) for f in fams) +
                  f" | {_fmt(acc.get('overall'))} | {_fmt(a.get('retention_nll'), '.4f')} |")
    md += ["", "## Paired changes (percentage points, same test cases)", "",
           "| comparison | mean | se | lo | hi | n | McNemar exact p | note |", "|---|---|---|---|---|---|---|---|"]
    for k in v["pairs"]:
        cells = _paired_cells(v[k])
        if cells is None:
            note = _no_data(v, k.split("-"), v[k].get("reason"))
            md.append(f"| {k} | — | — | — | — | 0 | — | {_cell(note)} |")
        else:
            mean, se, lo, hi, p = cells
            md.append(f"| {k} | {mean} | {se} | {lo} | {hi} | {v[k]['n']} | {p} | |")
    md += ["", "## Retention change against the seed (nats per target token)", "",
           "| arm | mean | se | upper (mean + z·se) | n | note |", "|---|---|---|---|---|---|"]
    for arm, r in v["retention_change"].items():
        note = _no_data(v, [arm, "seed"], r.get("reason")) if r["mean"] is None else ""
        md.append(f"| {arm} | {_fmt(r['mean'], '+.4f')} | {_fmt(r['se'], '.4f')} | {_fmt(r['upper'], '+.4f')} | "
                  f"{r['n']} | {_cell(note)} |")
    md += ["", "## Cost", "",
           f"Hosts priced as {v['budget']['price']['instance_type']} "
           f"(${v['budget']['price']['usd_per_host_hour']}/host-hour)"
           + (f"; the last $ column is a projection to the study's {v['budget']['price']['study_instance_type']} "
              f"hosts at the same host-hours." if v['budget']['price'].get('emulated') else "."), "",
           "| arm | GPU-s active | GPU-s total | host-hours | $ | $ on study hosts | logical bytes | "
           "after warm-up: logical per rank | after warm-up: wire tx per host | wire tx (all hosts) | cross-zone $ (measured) | cross-zone $ (from logical) | "
           "checkpoint s | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, c in v["cost"].items():
        if not c:
            md.append(f"| {arm} | — | — | — | — | — | — | — | — | — | — | — | — | "
                      f"no finished run: {_named(v, [arm])} |")
            continue
        tx = sum(h["wire_tx_bytes"] for h in c["wire_per_host"])
        md.append(f"| {arm} | {c['gpu_s_active']:.1f} | {c['gpu_s_total']:.1f} | {c['host_hours']:.4f} | "
                  f"{c['usd']:.4f} | {c['usd_on_study_hosts']:.4f} | {c['logical_bytes']:.3e} | "
                  f"{c.get('logical_bytes_after_warmup', 0):.3e} | {c.get('wire_tx_per_host_after_warmup', 0):.3e} | {tx:.3e} | "
                  f"{c['cross_zone_usd']:.6f} | {c['cross_zone_usd_projected_from_logical']:.6f} | "
                  f"{c['checkpoint_s']:.2f} | |")
    md += ["", f"**Cost in words:** {v['speed_screen']['cost_words']}.", "",
           "Wire bytes are the hosts' own interface counters (non-loopback) over the whole arm, worker "
           "start to end (start-up with DDP's weight broadcast, the updates, the checkpoint), so they "
           "include protocol overhead and logging; logical bytes are the compressed tensors only, "
           "warm-up included; the after-warm-up columns sum the updates after `powersgd.warmup_updates` for every "
           "arm alike (as upstream figures exclude the warm-up), wire bytes per host from the per-update counters. Where both ranks "
           "ran on one host, their traffic went over loopback and no cross-zone traffic was measured; a "
           "host is one network stack, so two namespaces of one machine count as two. The projected "
           "column prices the logical volume as if the two planned hosts were in different zones. "
           "Host-hours count the hosts an arm uses (its processes in `arms.rows`: one for `single`, two for the others) over its "
           "train wall time; a host kept up while idle, and the prepare, score and analyze steps, are "
           "not in these figures or in the budget line.", ""]
    md += _projection(v.get("projection") or {}, v)
    md += _attempts(rec, {a.get("failure_reason") for a in v["arms"].values()} - {None})
    md += ["## Plots", ""]
    md += [f"![{p.stem}]({p.name})" for p in plot_paths]
    return "\n".join(md) + "\n"


def _rate(mbit) -> str:
    if mbit is None:
        return "loopback"
    return f"{mbit / 1e3:g} Gbit/s" if mbit >= 1e3 else f"{mbit:g} Mbit/s"


def _projection(p: dict, v: dict) -> list[str]:
    """The study's hosts projected (`gradshare.cost.projection`), and this study's machine at other link
    rates from its own runs (`gradshare.cost.link`)."""
    if not p:
        return []
    md = ["## Projection (`gradshare project`)", ""]
    if "reason" in p:
        return md + [f"Not available: {p['reason']}.", ""]
    md += [P.markdown(p["study_hosts"]), "The plot `projected_speed_ratio.png` (below) draws the same for 2 to 64 hosts.", ""]
    m = p.get("measured") or {}
    if "reason" in m:
        md += [f"**This study's machine:** not projected: {m['reason']}.", ""]
    elif m:
        md += [f"**This study's machine** at other link rates, from its own medians (one device's update "
               f"{m['single_s']:.3f} s; each arm's own seconds beyond compute and link: "
               + ", ".join(f"{a} {x:+.3f} s" for a, x in m["extra_s"].items()) + "). The model's speed "
               "ratio is on median seconds per update; the measured one is the verdict's (active tokens/s); both "
               f"over {v['speed_screen']['baseline']}:", "",
               "| arm | link | s/update projected | measured | speed ratio, model | speed ratio, measured |",
               "|---|---|---|---|---|---|"]
        for r in m["rows"]:
            md.append(f"| {r['arm']} | {_rate(r['rate_mbit'])} | {r['s_per_update']:.3f} | "
                      f"{_fmt(r.get('measured_s_per_update'))} | {_fmt(r.get('speed_ratio'), '.2f')} | "
                      f"{_fmt(r.get('measured_speed_ratio'))} |")
        md += [""]
    for arm in m.get("missing") or {}:  # its reason is in the verdict table
        md.append(f"- {arm}: not projected from this machine ({_named(v, [arm])})")
    if m.get("missing"):
        md.append("")
    return md


def _links(v: dict, plan) -> list[str]:
    """How each arm exchanged its gradient (its kind's words) and over what link; a loud line where
    no byte crossed a link."""
    links = {arm: a.get("link") for arm, a in v["arms"].items() if arm != "seed" and a.get("link")}
    if not links:
        return []
    md = ["## Where the arms ran", "", "| arm | gradient exchange | link |", "|---|---|---|"]
    md += [f"| {arm} | {_cell(plan.arm(arm).method.describe(plan.arm(arm)))} | {_cell(link)} |"
           for arm, link in links.items()]
    if any(link.startswith("loopback") for link in links.values()):
        md += ["", "> **A two-process arm exchanged over loopback:** no byte crossed a link, so its "
               "speed says nothing about the study's cross-zone exchange; see the projection."]
    return md + [""]


def _attempts(rec: StudyRecord, shown: set[str] = frozenset()) -> list[str]:
    """Every attempt of every arm, failed ones included: a retried arm is visible as such. A
    reason already `shown` (in the verdict table) is referred to, not printed again."""
    def once(reason):
        return "the arm's reason, in the verdict table" if reason in shown else reason

    md = ["## Attempts", "", "| arm | attempt | run id | status | reason | resumed / full state |",
          "|---|---|---|---|---|---|"]
    for arm, a in rec.arms.items():
        if not a.attempts:
            md.append(f"| {arm} | — | {a.run_id or '—'} | {a.status} | {_cell(once(a.failure_reason))} | |")
        for t in a.attempts:
            # a resumed attempt that finished keeps no failure reason: its run ended well
            reason = None if t.get("status") == "FINISHED" else once(t.get("failure_reason"))
            md.append(f"| {arm} | {_fmt(t.get('attempt'), '')} | {t.get('run_id') or '—'} | "
                      f"{t.get('status')} | {_cell(reason)} | {_full_state_cell(t)} |")
    return md + [""]


def _full_state_cell(t: dict) -> str:
    parts = []
    if t.get("resumed_after_updates"):
        parts.append("resumed after update " + ", ".join(map(str, t["resumed_after_updates"])))
    if t.get("full_state_bytes"):
        s = f"full state {t['full_state_bytes'] / 1e6:,.1f} MB, saved in {t.get('full_state_save_s', 0):.2f} s"
        if t.get("full_state_load_s") is not None:
            s += f", loaded in {t['full_state_load_s']:.2f} s"
        parts.append(s)
    return "; ".join(parts)


def to_html(md_text: str, plot_paths: list[Path], title: str) -> str:
    """A self-contained HTML page rendered from the report's Markdown, plots inlined as base64."""
    import markdown as mdlib

    for p in plot_paths:
        data = base64.b64encode(p.read_bytes()).decode()
        md_text = re.sub(rf"\]\({re.escape(p.name)}\)", lambda _: f"](data:image/png;base64,{data})", md_text)
    conv = mdlib.Markdown(extensions=["tables", "fenced_code"])
    # Failure reasons are text, not markup: "<module>" in a traceback line must show as written.
    conv.preprocessors.deregister("html_block")
    conv.inlinePatterns.deregister("html")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;}table{border-collapse:collapse;"
             "margin:1em 0;}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;}pre{background:#f6f6f6;"
             "padding:1em;font-size:12px;overflow-x:auto;}img{max-width:100%;display:block;margin:1em 0;}"
             "blockquote{border-left:4px solid #c33;margin:1em 0;padding:0.2em 1em;background:#fff4f4;}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + conv.convert(md_text) + "\n</body></html>\n")
