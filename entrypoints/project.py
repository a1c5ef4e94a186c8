"""`gradshare project`: what the study's hosts would do, before anyone rents them: each arm's
seconds per update, speed ratio, GPU-seconds and dollars, and the break-even points of the speed
and cost screens.

    gradshare project                      # the full profile's inputs, built here by prepare's code
    gradshare project --study S            # a prepared study's own workload, and its machine's runs
    gradshare project --json p.json --plot p.png

The model and its inputs' provenance: `gradshare.cost.projection`; a study's own machine,
re-projected from its runs: `gradshare.cost.link`.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from gradshare.contract.errors import StudyError
from gradshare.contract.plan import load_plan
from gradshare.cost import link as ML
from gradshare.cost import measured as hosts_measured
from gradshare.cost.projection import DEFAULT_HOSTS, for_plan, markdown, plot
from gradshare.tracking import figures as study_figures
from gradshare.tracking import store, study_runs


def _numbers(kind, least: float, too_small: str):
    """An argparse type: numbers separated by commas, each finite and at least `least`; anything
    else is refused as argparse refuses a bad value (the usage line, exit status 2)."""
    def parse(text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
        if not all(math.isfinite(v) and v >= least for v in values):
            raise argparse.ArgumentTypeError(f"{too_small}, got {text!r}")
        return values
    return parse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="gradshare project", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", help="a prepared study: its own workload, and its machine's measured arms")
    ap.add_argument("--hosts", type=_numbers(int, 2, "a two-process arm needs at least 2 hosts"),
                    default=list(DEFAULT_HOSTS),
                    help="host counts of the plot, e.g. 2,4,8 (a two-process arm needs at least 2)")
    ap.add_argument("--rates-mbit", type=_numbers(float, 1e-3, "a link rate is a positive number of Mbit/s"),
                    default=[],
                    help="with --study: its machine's link rates, Mbit/s (default: the rate its arms ran over)")
    ap.add_argument("--json", help="also write everything to this file")
    ap.add_argument("--plot", help="also draw speed ratio against link rate to this PNG")
    args = ap.parse_args(argv)
    hosts, rates = args.hosts, args.rates_mbit
    if rates and not args.study:
        ap.error("--rates-mbit re-projects a study's own machine: it needs --study")
    out = {}
    prep = None
    if args.study:
        study_runs.existing_study(args.study)  # an unknown study is refused in one line, and never created
        try:
            prep, plan = store.prepared_plan(args.study)
        except StudyError as exc:
            raise SystemExit(f"[gradshare] project: {exc}") from None
        try:
            measured = ML.from_measurements(plan, study_figures.link_arms(args.study, plan),
                                            f"the machine study {args.study!r} ran on")
        except ValueError as exc:  # e.g. no finished single arm yet: the study's hosts still project
            out["measured"] = {"reason": str(exc)}
            print(f"## The machine study {args.study!r} ran on: not projected ({exc})\n")
        else:
            rows = ML.grid(measured, plan, hosts, rates or [measured.link_mbit])
            out["measured"] = {"machine": measured.name, "source": measured.source, "rows": rows}
            print(f"## {measured.name} ({measured.source})\n\n" + ML.table(rows, plan.screen.speed_baseline) + "\n")
    else:
        plan = load_plan("full", {})
    figures = study_figures.preflight(args.study) if args.study else None  # the preflight, where it ran
    if figures is not None:
        print(f"[gradshare] the link and host link {hosts_measured.provenance(figures)}", flush=True)
    p = for_plan(plan, study_figures.study_workload(prep, plan), log=lambda m: print(m, flush=True), hosts=hosts,
                 figures=figures)
    out["study_hosts"] = p
    print(f"## The study's hosts, a projection\n\n{markdown(p)}")
    if args.plot:
        print(f"plot: {plot(p, Path(args.plot))}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
