"""What the MLflow plugin (`entrypoints.mlflow_plugin`) does for `mlflow run` of this project:
it puts the run in the study's experiment.

MLflow asks the plugin for an experiment only when the command names none. For `mlflow run <this project>`
without `--experiment-name`, the launcher run then lands in the experiment named by
`-P study=NAME` (or the entry point's default study), not in "Default": one study, one
experiment. Before MLflow creates any run it also refuses, with one line and no run
left behind, what would otherwise leave a run RUNNING or FAILED for nothing:
    mlflow run . -e train -P arm=dense          # no conda here: one line, add --env-manager local
    mlflow run . -e train --env-manager local -P arm=dense2   # one line naming the study's arms
    mlflow run . -e prepare --env-manager local -P schedule.updatez=3   # one line: unknown field
    mlflow run . -e train --env-manager local -P arm=dense -P machine_rank=1   # one line: 0..0
    mlflow run . -e prepare --env-manager local -P model.source=hf:/no/such/dir   # one line: the forms

and it archives an earlier study first where `-P new_study=true` asks for it, so that
the launcher run is born in the new study's experiment. Any other `mlflow` command, or a
run of another project, is left to MLflow's own default.
"""
from __future__ import annotations

import difflib
import os
import shutil
import sys
from pathlib import Path

import yaml

from gradshare.contract.errors import StudyError
from gradshare.contract.plan import PlanError, load_plan, plan_keys
from gradshare.model.source import check_model_source
from gradshare.steps.emulated import MODES
from gradshare.steps.prepare import archive_existing_study
from gradshare.tracking import store, study_runs
from gradshare.tracking.connection import check_study_name
from gradshare.train.launch import launch_problem


PROJECT_NAME = "gradshare"


def _mlflow_run_params() -> dict | None:
    """The parsed `mlflow run` command line of this process, if it is one for this project."""
    argv = sys.argv
    if len(argv) < 2 or argv[1] != "run" or "mlflow" not in Path(argv[0]).as_posix():
        return None
    return _run_params(argv[2:])


def _run_params(args: list[str]) -> dict | None:
    """`mlflow run ARGS` parsed as MLflow parses it, if ARGS name this project."""
    import mlflow.cli

    try:
        params = mlflow.cli.run.make_context("run", list(args), resilient_parsing=True).params
    except Exception:  # not a command line MLflow itself would accept: its own error follows
        return None
    uri = params.get("uri") or ""
    mlproject = Path(uri) / "MLproject"
    if not mlproject.is_file():
        return None

    try:
        name = (yaml.safe_load(mlproject.read_text()) or {}).get("name")
    except yaml.YAMLError:
        return None
    return params if name == PROJECT_NAME else None


class Refused(Exception):
    """A command line refused before any run; its text is the one line the user sees."""


def _refuse(line: str) -> None:
    raise Refused(f"gradshare: {line}; nothing was recorded")


def _values(params: dict) -> tuple[dict[str, str], dict[str, str]]:
    """The `-P` values as given, and the entry point's declared parameters with their defaults."""
    from mlflow.projects._project_spec import load_project

    values = dict(p.split("=", 1) for p in params.get("param_list") or () if "=" in p)
    entry = load_project(params["uri"]).get_entry_point(params.get("entry_point") or "main")
    return values, {name: p.default for name, p in entry.parameters.items()}


def refusal(args: list[str]) -> str | None:
    """The one line with which `mlflow run ARGS` of this project is refused before MLflow makes
    any run, or None where it would go ahead (what the plugin decides, without running it)."""
    params = _run_params(args)
    if params is None:
        return None
    try:
        _check(params, *_values(params))
    except Refused as exc:
        return str(exc)
    return None


def _check(params: dict, values: dict[str, str], declared: dict[str, str]) -> None:
    """Refuse the command line before MLflow makes a run. `values`: the `-P` parameters as
    given; `declared`: the entry point's parameters in the MLproject, with their defaults."""

    manager = params.get("env_manager")
    if manager in (None, "conda") and shutil.which("conda") is None and not (
            os.environ.get("MLFLOW_CONDA_HOME") or os.environ.get("CONDA_EXE")):
        _refuse("`mlflow run` without --env-manager uses conda (conda.yaml), which this machine "
                "does not have: add --env-manager local")
    entry = params.get("entry_point") or "main"
    takes_plan = entry in ("prepare", "study")  # the steps that fix the plan
    for key, value in values.items():  # MLflow would pass these on as `--key value`: the step refuses them
        if key in declared:
            continue
        if "." not in key:
            near = [k for k in plan_keys() if takes_plan and k.split(".", 1)[1] == key] or \
                difflib.get_close_matches(key, declared, n=1)
            hint = f"did you mean {' or '.join(repr(k) for k in near)}? " if near else ""
            _refuse(f"-P {key}={value} is not a parameter of -e {entry}: {hint}it takes "
                    f"{', '.join(declared)}" + (", and plan fields as concern.field" if takes_plan else ""))
        if not takes_plan:
            _refuse(f"-P {key}={value} is a plan field, and -e {entry} takes its plan from the prepare "
                    f"run: plan fields are set at -e prepare or -e study")
    if "study" in values:
        try:
            check_study_name(values["study"])
        except StudyError as exc:
            _refuse(f"-P study: {exc}")
    if entry == "train":
        if problem := launch_problem({**declared, **values}):
            _refuse(f"-P {problem[1]}")
        if values.get("arm") is not None:  # after the checks that need no tracking server
            _check_arm(values.get("study", declared.get("study")), values["arm"])
    hosts = values.get("hosts")
    if entry == "study" and hosts is not None:
        if hosts not in MODES:
            _refuse(f"-P hosts={hosts} is not a choice: choose one of {', '.join(MODES)}")
    if takes_plan:  # refuse a plan that cannot be run, or a model no step could load
        overrides = {k: v for k, v in values.items() if "." in k}
        try:
            plan = load_plan(values.get("profile", declared.get("profile", "tiny")), overrides)
            # a relative hf: path is read where the steps run: the project's directory
            check_model_source(plan, base=params.get("uri"))
        except PlanError as exc:
            _refuse(" ".join(str(exc).split()))


def _check_arm(study: str, arm: str) -> None:
    """Refuse an arm that the study's prepared plan does not run (its `arms.rows` name the arms),
    and a study with no prepared plan to train: the train step would refuse both, after making a run."""
    try:
        _, plan = store.prepared_plan(study)
    except StudyError as exc:
        _refuse(f"-P arm={arm}: {exc}")
    if arm not in plan.arms.names:
        _refuse(f"-P arm={arm} is not an arm of study {study!r}: choose one of {', '.join(plan.arms.names)}")


def experiment_id() -> str:
    """The study's experiment for this `mlflow run` command line, after its checks; a refusal
    or any failure prints one line and exits 2 (not an Exception: MLflow's provider loop turns
    one into a warning and the Default experiment, which would split the study)."""
    try:
        return _experiment_id()
    except SystemExit:
        raise
    except Refused as exc:
        refused = str(exc)
    except Exception as exc:
        refused = (f"gradshare: could not place this run in its study's experiment "
                   f"({type(exc).__name__}: {exc}); nothing was recorded")
    print(refused, file=sys.stderr)
    raise SystemExit(2)


def in_context() -> bool:
    return _mlflow_run_params() is not None


def _experiment_id() -> str:
    params = _mlflow_run_params()
    values, defaults = _values(params)
    _check(params, values, defaults)
    study = values.get("study") or defaults.get("study")
    if str(values.get("new_study", "")).lower() in ("1", "true", "yes"):
        archived = archive_existing_study(study)
        if archived:
            print(f"[gradshare] earlier study archived as experiment {archived!r}", file=sys.stderr)
    entry = params.get("entry_point") or "main"
    return study_runs.setup(study, create=entry in ("prepare", "study"))  # the others read a study
