"""Entry point `prepare`: make, hash and register every input of the study.

    mlflow run . -e prepare --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny
    python -m entrypoints.prepare --study gradshare-tiny [--profile full] [--schedule.updates 8 ...]

Any plan field can be overridden as `-P concern.field=value` (see gradshare/contract/plan.py).
A second prepare of the same study refuses; `-P new_study=true` archives the old
study's experiment (renamed, nothing deleted) and starts a new one. A `model.source` no
step could load (`gradshare.model.source.check_model_source`) is refused before any run.
"""
from __future__ import annotations

import shutil
import time

from entrypoints.common import parse, study_parser, truthy
from gradshare.contract.errors import StudyError
from gradshare.contract.plan import PlanError, load_plan
from gradshare.contract.tags import DEVICE_NOTE, PLAN_SHA, PRICE_WARNING
from gradshare.cost.limits import START_PARAM
from gradshare.cost.prices import refreshed_price
from gradshare.inputs.build import build_inputs
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
        existing = [r for r in study_runs.search(args.study, "prepare", status="FINISHED") if r.info.run_id != run.info.run_id]
        if existing:
            raise StudyError(
                f"study {args.study!r} is already prepared (run {existing[0].info.run_id}); its inputs are "
                f"pre-registered and are not regenerated. Start a new study with -P new_study=true "
                f"(archives this one) or choose another -P study=NAME")

        import mlflow

        # the study's clock (deadline, budget) starts here
        mlflow.log_param(START_PARAM, f"{time.time():.3f}")
        plan = load_plan(args.profile, overrides)
        plan = _priced(plan, overrides)
        mlflow.set_tag(PLAN_SHA, plan.sha256())
        inputs = P.scratch_dir()
        try:
            manifest = build_inputs(plan, inputs)
            P.log_prepare_run(plan, inputs, manifest)
        finally:
            shutil.rmtree(inputs, ignore_errors=True)
        print(f"[gradshare] prepared study {args.study!r}: plan_sha256 {plan.sha256()}, "
              f"run {run.info.run_id}")
        if note := device_note(plan):
            print(note, flush=True)
            mlflow.set_tag(DEVICE_NOTE, note)


def device_note(plan) -> str | None:
    """One line where the plan's arms need GPUs this machine lacks: prepare itself runs anywhere,
    and says so instead of leaving the surprise to train."""
    if plan.hardware.device != "cuda":
        return None
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    a = plan.arms
    need = {arm: a.processes(arm) for arm in a.names}
    if have >= max(need.values()):
        return None
    arms = ", ".join(f"{arm} {n} GPU{'s' if n > 1 else ''}" for arm, n in need.items())
    return (f"[gradshare] note: this plan's arms run on CUDA GPUs ({arms}; a two-GPU arm may use two hosts with "
            f"one each) and this machine has {have}: prepare is done here, train the arms where the GPUs are")


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


def _priced(plan, overrides: dict):
    """With `infra.refresh_prices`, the plan carries the AWS Price List API's price and date, or
    the declared ones with a warning; the run records which (`price_source`)."""
    import mlflow

    if not plan.infra.refresh_prices:
        mlflow.log_param("price_source", "declared in the plan")
        return plan

    usd, date, warning = refreshed_price(plan)
    if warning:
        print(f"[gradshare] warning: {warning}", flush=True)
        mlflow.set_tag(PRICE_WARNING, warning)
        mlflow.log_param("price_source", "declared in the plan (the Price List API did not answer)")
        return plan
    mlflow.log_param("price_source", f"AWS Price List API, {date}")
    print(f"[gradshare] {plan.infra.instance_type}: ${usd}/h from the AWS Price List API ({date})", flush=True)
    return load_plan(plan.study.profile, {**overrides, "infra.usd_per_host_hour": str(usd), "infra.price_date": date})


if __name__ == "__main__":
    main()
