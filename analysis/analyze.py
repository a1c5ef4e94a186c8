"""The analyze step: collect the study through the tracking API, decide, report, log.

Artifacts of the analyze run: `verdicts.json`, `report.md`, `report.html` and the
plots. The verdict table is printed to the terminal. Analysis is a pure function of
the store: running it twice gives the same `verdicts.json`.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from analysis.collect import collect
from analysis.preconditions import screen_word
from analysis.report import markdown, plots, to_html, verdict_table
from analysis.verdicts import compute, verdict_metrics
from gradshare.contract.metrics import paired_metrics
from gradshare.contract.tags import NOTE, PLAN_SHA, screen_tag


def analyze(study: str, out: Path | None = None) -> tuple[dict, Path]:
    rec = collect(study)
    v = compute(rec)
    out = out or Path(tempfile.mkdtemp(prefix="gradshare-report-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdicts.json").write_text(json.dumps(v, indent=1, sort_keys=True, default=float) + "\n")
    plot_paths = plots(rec, v, out)
    md = markdown(rec, v, plot_paths)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(to_html(md, plot_paths, f"gradshare — {study}"))
    return v, out


def log_analysis(v: dict, out: Path) -> None:
    """The artifacts, and the verdict where the runs table shows it: each screen's word as a
    param (`quality_screen`, `speed_screen`: pass, fail, not-applicable, or null where an arm it
    needs is missing) and the figures behind them as metrics (`verdict/...`, `cost/<arm>/...`)."""
    import mlflow

    mlflow.set_tag(PLAN_SHA, v["plan_sha256"])
    # the verdict as the first thing on the study's page and on the run's, no column to add
    note = description(v)
    mlflow.set_tag(NOTE, note)
    run = mlflow.active_run()
    mlflow.MlflowClient().set_experiment_tag(run.info.experiment_id, NOTE, note)
    mlflow.log_artifacts(str(out))
    words = {name: screen_word(v[name]) for name in ("quality_screen", "speed_screen")}
    mlflow.set_tags({screen_tag(name): word for name, word in words.items()})
    mlflow.log_params(words)
    mlflow.log_metrics(paired_metrics(v) | verdict_metrics(v))


def headline(v: dict) -> str:
    """Both screens with their margins and the money, in one line: what the study's page shows
    first, e.g. `Quality PASS (+13.6 pp; retention -0.14 nats) · Speed FAIL (0.39x single; needs
    1.10x) · $0.07 of $100`."""
    q, s, b = v["quality_screen"], v["speed_screen"], v["budget"]
    checks = q.get("checks") or {}
    quality = screen_word(q).upper()
    if "task_gain" in checks and "retention" in checks:
        quality += (f" ({checks['task_gain']['value_pp']:+.1f} pp; retention "
                    f"{checks['retention']['upper_nats']:+.2f} nats)").replace("-", "\u2212")
    speed = screen_word(s).upper()
    if s.get("ratio") is not None:
        speed += f" ({s['ratio']:.2f}\u00d7 {s['baseline']}; needs {s['threshold']:.2f}\u00d7)"
    return f"Quality {quality} \u00b7 Speed {speed} \u00b7 ${b['usd']:.2f} of ${b['budget_usd']:.0f}"


def description(v: dict) -> str:
    """The study's page and the analyze run's description (markdown): both screens with their
    margins and the money in the heading (`headline`), the verdict table beneath, where the report is."""
    return (f"### {headline(v)}\n\n"
            f"```\n{verdict_table(v)}\n```\n\n"
            f"The whole report: the latest `analyze` run's artifacts (`report.html`, `verdicts.json`).\n")


def run(study: str) -> dict:
    v, out = analyze(study)
    try:
        log_analysis(v, out)
        print(verdict_table(v))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return v
