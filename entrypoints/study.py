"""Entry point `study`: the whole pre-registered study, end to end.

    mlflow run . -e study --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny
    python -m entrypoints.study --study gradshare-tiny --new-study true   # archive an earlier one

Runs prepare, the arms single, dense and powersgd in sequence (never overlapping),
commit, score and analyze; prints the verdicts and the command that opens the
MLflow UI on the study. `--hosts` (`-P hosts=`): `auto` (default) runs the two-process
arms across two emulated hosts joined by the plan's shaped link where this machine
allows it (root, `ip`, `tc`) and over loopback otherwise, saying so; `emulated` refuses
instead of falling back; `loopback` never emulates. An impossible plan or a model no step
could load (`gradshare.model.source.check_model_source`) is refused before anything is stored.

SIGTERM or Ctrl-C, to this step or to the `mlflow run` that started it, stops the whole study:
the running step stops its processes and ends its run KILLED `interrupted: ...`, then the study's
own run. Run again without `new_study`, the study continues where it stopped: steps done are
skipped, an interrupted arm trains again (its interrupted attempt used none of
`arms.max_attempts`).
"""
from __future__ import annotations

import os
import sys
import time

from entrypoints.common import parse, study_parser, truthy
from gradshare.contract.plan import PlanError, load_plan
from gradshare.contract.tags import FAILURE, INTERRUPTED, PLAN_SHA, STEP, STUDY
from gradshare.model.source import check_model_source
from gradshare.steps.study import run_study, ui_hint
from gradshare.tracking import connection, study_runs
from gradshare.tracking.orphans import process_tags


def main(argv=None) -> None:
    ap = study_parser(__doc__, makes_plan=True)
    ap.add_argument("--hosts", default="auto", choices=("auto", "emulated", "loopback"),
                    help="where the two-process arms run (default auto)")
    args, overrides = parse(ap, argv)

    try:  # before anything is stored or an earlier study archived: a plan or model that cannot run
        plan = load_plan(args.profile, overrides)
        check_model_source(plan)
    except PlanError as exc:
        ap.error(" ".join(str(exc).split()))
    connection.stop_on_sigterm()  # SIGTERM stops the study as Ctrl-C does: every step ends its run first
    study_runs.setup(args.study)
    launcher = os.environ.get("MLFLOW_RUN_ID")  # the run `mlflow run -e study` made: label it
    tag = (lambda k, v: connection.client().set_tag(launcher, k, v)) if launcher else (lambda k, v: None)
    tag(STUDY, args.study)
    tag(STEP, "study")
    tag("mlflow.runName", "study")  # its row in the runs table, beside prepare, train-..., analyze

    for key, value in process_tags().items():  # alive while its steps run: never swept by them
        tag(key, value)
    t0 = time.perf_counter()
    try:
        tag(PLAN_SHA, plan.sha256())
        timings = run_study(args.study, args.profile, truthy(args.new_study), overrides, args.hosts)
    except KeyboardInterrupt as exc:  # SIGTERM (to it, or passed on by `mlflow run`) or Ctrl-C
        # every step it started has ended its own run KILLED "interrupted" by now (MLflow's
        # launcher stops its step and waits); the study's own run says so too, and a re-run continues
        text = f"interrupted: {' '.join(str(exc).split()) or 'stopped by the user (interrupt)'}; run the study " \
               f"again (without new_study) to continue where it stopped"
        print(f"[gradshare] study {args.study!r} {text}", file=sys.stderr, flush=True)
        tag(FAILURE, text)
        tag(INTERRUPTED, "true")
        if launcher:
            connection.mlflow_run_keeps_the_steps_end()  # MLflow's launcher leaves KILLED as it is
            connection.client().set_terminated(launcher, "KILLED")
        raise SystemExit(130) from None
    except BaseException as exc:  # the study's run says why it ended
        text = str(exc)
        if isinstance(exc, SystemExit) and (exc.code is None or isinstance(exc.code, int)):
            text = f"a step of the study failed: see that step's {FAILURE}"
        tag(FAILURE, text or type(exc).__name__)
        raise
    print("\n[gradshare] step seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    print(f"[gradshare] study {args.study!r} done in {time.perf_counter() - t0:.0f}s")
    print(f"[gradshare] MLflow UI: {ui_hint(args.study)}")


if __name__ == "__main__":
    main()
