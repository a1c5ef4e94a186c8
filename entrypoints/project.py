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

    speed ratio     tokens/s of the arm over single's, over the whole schedule (what the screen asks)
    GPU-seconds     W x the arm's seconds; cheaper = fewer than single's (active, as the report)
    dollars         GPU-seconds x price per host-hour + cross-zone bytes x price per GB each way

Every input carries its provenance: prepared (the study's schedule), measured (the H200 call:
where, when, which commit) or declared (the plan, with its source). A study's own machine,
re-projected from its runs, is `gradshare.cost.link`.
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
            plan, measured = ML.from_study(args.study)
        except ValueError as exc:  # e.g. no finished single arm yet: the study's hosts still project
            out["measured"] = {"reason": str(exc)}
            print(f"## The machine study {args.study!r} ran on: not projected ({exc})\n")
        else:
            rows = ML.grid(measured, plan, hosts, rates or [measured.link_mbit])
            out["measured"] = {"machine": measured.name, "source": measured.source, "rows": rows}
            print(f"## {measured.name} ({measured.source})\n\n" + ML.table(rows) + "\n")
    else:
        plan = load_plan("full", {})
    figures = hosts_measured.latest(args.study) if args.study else None  # the preflight, where it ran
    if figures is not None:
        print(f"[gradshare] the link and host link {hosts_measured.provenance(figures)}", flush=True)
    p = for_plan(plan, prep, log=lambda m: print(m, flush=True), hosts=hosts, figures=figures)
    out["study_hosts"] = p
    print(f"## The study's hosts, a projection\n\n{markdown(p)}")
    if args.plot:
        print(f"plot: {plot(p, Path(args.plot))}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
