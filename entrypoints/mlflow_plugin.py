"""MLflow plugin: `mlflow run` of this project puts its run in the study's experiment, after
refusing, with one line and no run, a command line that would leave a run for nothing
(`entrypoints.mlflow_run_checks` says which).

Registered as a `mlflow.default_experiment_provider` (pyproject.toml). MLflow loads this module
in every process that imports mlflow, whatever it runs: the server, `mlflow ui`, a user's own
script. So it imports nothing of gradshare until MLflow asks it about an `mlflow run` command
line; `tests/unit/entrypoints/test_light_imports.py` holds it to that.
"""
from __future__ import annotations

import sys
from pathlib import Path

from mlflow.tracking.default_experiment.abstract_context import DefaultExperimentProvider


def _is_mlflow_run() -> bool:
    """This process is `mlflow run ...` (of some project): the one command the checks are for."""
    return len(sys.argv) > 1 and sys.argv[1] == "run" and "mlflow" in Path(sys.argv[0]).as_posix()


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
