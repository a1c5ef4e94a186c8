"""The whole study from one command: prepare, the three arms in sequence, commit,
score, analyze — each its own MLflow run, started through `mlflow.projects.run`
exactly as a user would start it, so that every step is recorded the same way.

An arm that fails stays FAILED and the study goes on to commit it as such; a
failure of prepare, commit, score or analyze stops the study.

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
from pathlib import Path

from gradshare.contract.plan import load_plan
from gradshare.contract.tags import FAILURE, REFUSAL
from gradshare.cost.guard import start_detached
from gradshare.steps.emulated import (
    absolute_tracking_env,
    choose_link,
    run_arm_across,
)
from gradshare.steps.prepare import archive_existing_study
from gradshare.tracking import connection, study_runs
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


def run_study(study: str, profile: str, new_study: bool, overrides: dict[str, str], hosts: str = "auto") -> dict:

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
    ok, timings["prepare"] = _step("prepare", study, {"profile": profile, **overrides})
    if not ok:
        raise SystemExit(f"prepare failed: see its run's {FAILURE}")
    if plan.infra.instance_ids:  # the hosts stop at the deadline even if this process dies
        guard = start_detached(study)
        print(f"[gradshare] guard started (pid {guard.pid}): stops {', '.join(plan.infra.instance_ids)} at the "
              f"deadline; its log: guard-{study}.log", flush=True)
    for arm in plan.arms.names:  # one after another, never overlapping
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
