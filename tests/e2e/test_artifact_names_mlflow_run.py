"""A study name that could name a path, through `mlflow run` (the MLflow plugin): refused before
MLflow makes a run. (The same name straight to every step's parser: tests/unit/tracking/test_artifact_names.py.)"""
from __future__ import annotations

import mlflow
import pytest

from tests.conftest import mlflow_run_as_typed

pytestmark = pytest.mark.e2e


def test_through_mlflow_run_a_path_like_study_name_is_refused_before_mlflow_makes_a_run(mlflow_server):
    before = {r.info.run_id for r in mlflow.search_runs(search_all_experiments=True, output_format="list")}
    proc = mlflow_run_as_typed("-e", "prepare", "--env-manager", "local", "-P", "study=../../tmp/evil")
    assert proc.returncode != 0
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("gradshare:")]
    assert "-P study: study name '../../tmp/evil' is not allowed" in line
    assert {r.info.run_id for r in mlflow.search_runs(search_all_experiments=True, output_format="list")} == before
