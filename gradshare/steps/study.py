"""The whole study from one command: prepare, the three arms in sequence, commit,
score, analyze — each its own MLflow run, started through `mlflow.projects.run`
exactly as a user would start it, so that every step is recorded the same way.

An arm that fails stays FAILED and the study goes on to commit it as such; a
failure of prepare, commit, score or analyze stops the study. Run again, a study continues where
it stopped: steps done are skipped (said), an arm whose attempt was interrupted trains again.

The two-process arms run across two emulated hosts joined by the plan's shaped link
(`gradshare.steps.emulated`) when the machine allows it (`hosts=auto`: root, `ip`, `tc`, a
tracking store the namespaces reach); otherwise over loopback, which the output and the
report say, with the reason. `hosts=emulated` refuses instead of falling back;
`hosts=loopback` never emulates.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from pathlib import Path

from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ATTEMPT, FAILURE, INTERRUPTED, REFUSAL
from gradshare.steps.emulated import (
    absolute_tracking_env,
    choose_link,
    run_arm_across,
)
from gradshare.steps.guard import start_detached
from gradshare.steps.prepare import archive_existing_study
from gradshare.tracking import connection, store, study_runs
from gradshare.tracking.server import NO_JOBS
from gradshare.train.env import LINK_ENV


REPO = Path(__file__).resolve().parents[2]  # the checkout: its MLproject launches every step


def _step(entry: str, study: str, params: dict) -> tuple[bool, float]:
    import mlflow
    from mlflow.exceptions import ExecutionException

    t0 = time.perf_counter()
    print(f"\n[gradshare] ── {entry} {' '.join(f'{k}={v}' for k, v in params.items() if k != 'study')}", flush=True)
    try:
        mlflow.projects.run(str(REPO), entry_point=entry, parameters={"study": study, **params},
                            env_manager="local", experiment_name=study, synchronous=True)
        return True, time.perf_counter() - t0
    except ExecutionException as exc:
        print(f"[gradshare] {entry} ended {_ended(exc)}: {exc}", flush=True)
        return False, time.perf_counter() - t0


def _ended(exc: Exception) -> str:
    """How the step's run ended: FAILED, or KILLED where it was refused (nothing attempted)."""
    found = re.search(r"Run \(ID '([0-9a-f]+)'\)", str(exc))
    try:
        run = connection.client().get_run(found.group(1)) if found else None
    except Exception:  # noqa: BLE001 - the words only: the run says it itself
        run = None
    if run is not None and run.data.tags.get(REFUSAL) == "true":
        return f"{run.info.status} (refused)"
    return "FAILED"


def _arm_across(study: str, arm: str, plan) -> tuple[bool, float]:
    t0 = time.perf_counter()
    print(f"\n[gradshare] ── train arm={arm} across two emulated hosts, {plan.link.rate_mbit:g} Mbit/s", flush=True)
    # the driver stops the arm at the plan's limit; this one only catches a launch that never ends
    ok = run_arm_across(study, arm, plan.link.rate_mbit, plan.arms.timeout_s(plan.schedule.updates) + 300)
    if not ok:
        print(f"[gradshare] train arm={arm} ended FAILED: see its run's {FAILURE}", flush=True)
    return ok, time.perf_counter() - t0


def _prepared_already(study: str, plan, new_study: bool) -> str | None:
    """The run that prepared this study with this plan, where it did: a study run again (after an
    interrupt, a failed step) continues where it stopped. A study prepared with another plan is
    refused, naming both hashes (its inputs are pre-registered; `new_study` archives it)."""
    if new_study:
        return None
    done = study_runs.search(study, "prepare", status="FINISHED")
    if not done:
        return None
    _, prepared = store.prepared_plan(study)
    # a price refreshed from the AWS Price List API at prepare (`infra.refresh_prices`) is the plan's own
    mine = replace(plan, infra=replace(plan.infra, usd_per_host_hour=prepared.infra.usd_per_host_hour,
                                       price_date=prepared.infra.price_date))
    if mine.sha256() != prepared.sha256():
        differ = sorted(k for k, v in mine.flat().items() if prepared.flat().get(k) != v)
        raise SystemExit(f"[gradshare] study {study!r} was prepared with another plan (plan_sha256 "
                         f"{prepared.sha256()[:16]}, this command's {mine.sha256()[:16]}; they differ in "
                         f"{', '.join(differ[:6])}): run it with the same -P fields to continue it, or "
                         f"-P new_study=true to archive it and start again")
    return done[0].info.run_id


def _arm_ended(study: str, arm: str, plan) -> str | None:
    """Why the arm is not trained again in a study that continues: FINISHED, or its attempts used
    (`arms.max_attempts`; an interrupted attempt uses none); None where it trains."""
    runs = study_runs.search(study, "train", arm)
    if done := [r for r in runs if r.info.status == "FINISHED"]:
        return f"done already (run {done[0].info.run_id})"
    used = [r for r in runs if ATTEMPT in r.data.tags and r.data.tags.get(REFUSAL) != "true"
            and r.data.tags.get(INTERRUPTED) != "true" and r.info.status != "RUNNING"]
    if len(used) >= plan.arms.max_attempts:
        return (f"its {len(used)} attempt(s) ended {', '.join(r.info.status for r in used)}: not trained again "
                f"(arms.max_attempts {plan.arms.max_attempts}); the commit records it as it ended")
    return None


def run_study(study: str, profile: str, new_study: bool, overrides: dict[str, str], hosts: str = "auto") -> dict:
    """Every step of the study in order, each a run of its own; on a study run before (stopped by
    an interrupt or a failed step), the steps already done are skipped, said, and it continues."""

    plan = load_plan(profile, overrides)  # refuse an impossible plan before anything runs
    connection.mlflow_run_keeps_the_steps_end()  # this process launches the steps: a refused one stays KILLED
    # every step runs in the checkout: a relative SQLite path must mean this directory's file
    import mlflow

    os.environ.update(absolute_tracking_env())
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    link = choose_link(hosts, plan)
    print(f"[gradshare] two-process arms: {link.note}", flush=True)
    if new_study and (archived := archive_existing_study(study)):
        print(f"[gradshare] earlier study archived as experiment {archived!r}")
    timings = {}
    if (prepared := _prepared_already(study, plan, new_study)) is not None:
        print(f"\n[gradshare] ── prepare: done already (run {prepared}): the study continues where it stopped",
              flush=True)
    else:
        ok, timings["prepare"] = _step("prepare", study, {"profile": profile, **overrides})
        if not ok:
            raise SystemExit(f"prepare failed: see its run's {FAILURE}")
    if plan.infra.instance_ids:  # the hosts stop at the deadline even if this process dies
        guard = start_detached(study)
        print(f"[gradshare] guard started (pid {guard.pid}): stops {', '.join(plan.infra.instance_ids)} at the "
              f"deadline; its log: guard-{study}.log", flush=True)
    for arm in plan.arms.names:  # one after another, never overlapping
        if (ended := _arm_ended(study, arm, plan)) is not None:
            print(f"\n[gradshare] ── train arm={arm}: {ended}", flush=True)
            continue
        if plan.arms.processes(arm) == 2 and link.emulated:
            _, timings[f"train-{arm}"] = _arm_across(study, arm, plan)
            continue
        if plan.arms.processes(arm) > 1:
            os.environ[LINK_ENV] = link.note  # the arm's run logs it as its `link`
        try:
            _, timings[f"train-{arm}"] = _step("train", study, {"arm": arm})
        finally:
            os.environ.pop(LINK_ENV, None)
    for entry in ("commit", "score", "analyze"):
        if entry != "analyze" and (done := study_runs.search(study, entry, status="FINISHED")):
            print(f"\n[gradshare] ── {entry}: done already (run {done[0].info.run_id})", flush=True)
            continue
        ok, timings[entry] = _step(entry, study, {})
        if not ok:
            raise SystemExit(f"{entry} failed: see its run's {FAILURE}")
    return timings


def ui_hint(study: str) -> str:
    """Where the study's runs table opens: its server's, or the light UI's command on its store
    (without MLflow's job runner: eight processes a study never uses)."""
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI", connection.DEFAULT_URI)
    exp = mlflow.get_experiment_by_name(study)
    eid = exp.experiment_id if exp else "?"
    if uri.startswith("http"):
        return f"open {study_runs.runs_table(eid, uri)}"
    light = " ".join(f"{k}={v}" for k, v in NO_JOBS.items())
    return (f"{light} mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000   # then open "
            f"{study_runs.runs_table(eid, 'http://127.0.0.1:5000')}")
