"""Entry point `prepare`: make, hash and register every input of the study
(`gradshare.steps.prepare.prepare_study`).

    mlflow run . -e prepare --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny
    python -m entrypoints.prepare --study gradshare-tiny [--profile full] [--schedule.updates 8 ...]

Any plan field can be overridden as `-P concern.field=value` (see gradshare/contract/plan.py).
A second prepare of the same study refuses; `-P new_study=true` archives the old
study's experiment (renamed, nothing deleted) and starts a new one. A `model.source` no
step could load (`gradshare.model.source.check_model_source`) is refused before any run.
"""
from __future__ import annotations

from entrypoints.common import parse, study_parser, truthy
from gradshare.contract.plan import PlanError, load_plan
from gradshare.model.source import check_model_source
from gradshare.steps import prepare as P
from gradshare.tracking import study_runs


def main(argv=None) -> None:
    ap = study_parser(__doc__, makes_plan=True)
    args, overrides = parse(ap, argv)

    _refuse_before_any_run(ap, args, overrides)
    study_runs.setup(args.study)
    if truthy(args.new_study):
        archived = P.archive_existing_study(args.study)
        if archived:
            print(f"[gradshare] previous study archived as experiment {archived!r}")
    # prepare is the step that makes a study: after an archive the name is free again
    with study_runs.study_run(args.study, "prepare", run_name="prepare", create=True) as run:
        P.prepare_study(args.study, args.profile, overrides, run)


def _refuse_before_any_run(ap, args, overrides: dict) -> None:
    """Before anything is stored or archived: a model no step could load is refused (as the
    `mlflow run` plugin refuses it), and so is an impossible plan where --new-study would
    otherwise archive the study it replaces for nothing. Without --new-study an impossible
    plan fails its prepare run, with the reason, as ever."""

    try:
        plan = load_plan(args.profile, overrides)
    except PlanError as exc:
        if truthy(args.new_study):
            ap.error(" ".join(str(exc).split()))
        return
    try:
        check_model_source(plan)
    except PlanError as exc:
        ap.error(" ".join(str(exc).split()))


if __name__ == "__main__":
    main()
