"""MLflow plugin: `mlflow run` of this project puts its run in the study's experiment, after
refusing, with one line and no run, a command line that would leave a run for nothing
(`entrypoints.mlflow_run_checks` says which).

Registered as a `mlflow.default_experiment_provider` (pyproject.toml). MLflow loads this module
in every process that imports mlflow, whatever it runs: the server, `mlflow ui`, a user's own
script. So it imports nothing of gradshare until MLflow asks it about an `mlflow run` command
line; `tests/unit/entrypoints/test_light_imports.py` holds it to that. In an `mlflow run`
process it also makes SIGTERM stop the step it launched (`_stop_on_sigterm`) and leaves a run its
step ended KILLED as it is (`_keep_the_steps_end`).
"""
from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from mlflow.tracking.default_experiment.abstract_context import DefaultExperimentProvider


def _is_mlflow_run() -> bool:
    """This process is `mlflow run ...` (of some project): the one command the checks are for. As
    `python -m mlflow run`, `sys.argv[0]` reads `-m` while MLflow's package loads (when this module
    is imported): the interpreter's own command line says it then."""
    if len(sys.argv) > 1 and sys.argv[1] == "run" and "mlflow" in Path(sys.argv[0]).as_posix():
        return True
    orig = list(getattr(sys, "orig_argv", []))
    return any(orig[i:i + 3] == ["-m", "mlflow", "run"] for i in range(len(orig)))


def _stop_on_sigterm() -> None:
    """In `mlflow run`, SIGTERM does what Ctrl-C does: MLflow's launcher stops its step (SIGTERM)
    and waits for it, so the step ends its run KILLED "interrupted" and stops its own processes
    (a SIGTERM's default would end the launcher alone and leave the step and its run running).
    Once: a second SIGTERM while it stops is ignored."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    stopping = []

    def handler(signum, _frame):
        if stopping:
            return
        stopping.append(signum)
        raise KeyboardInterrupt("stopped by signal SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def _keep_the_steps_end() -> None:
    """In `mlflow run`, a run its step ended (KILLED: refused or interrupted) stays as the step
    ended it: MLflow 3.17's launcher would end it FAILED (`tracking.connection.
    mlflow_run_keeps_the_steps_end` says why). Imported here only in `mlflow run` (28 ms)."""
    try:
        from gradshare.tracking.connection import mlflow_run_keeps_the_steps_end

        mlflow_run_keeps_the_steps_end()
    except Exception:  # noqa: BLE001 - MLflow's own ending stands
        pass


if _is_mlflow_run():
    _stop_on_sigterm()
    _keep_the_steps_end()


class StudyExperimentProvider(DefaultExperimentProvider):
    # The checks are imported only for `mlflow run` (allow-listed in tests/unit/test_layers.py):
    # they load the plan, the study's tracking and the launcher's checks, seconds that no other
    # mlflow command should pay.
    def in_context(self) -> bool:
        if not _is_mlflow_run():
            return False
        from entrypoints import mlflow_run_checks

        return mlflow_run_checks.in_context()

    def get_experiment_id(self) -> str:
        from entrypoints import mlflow_run_checks

        return mlflow_run_checks.experiment_id()
