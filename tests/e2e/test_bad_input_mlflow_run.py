"""A bad launch parameter through `mlflow run` with an experiment named: MLflow makes the run
(the plugin is not asked), and the entry point's own check ends it as a refusal. (The other bad
parameters: tests/unit/entrypoints/test_bad_input.py, whose real `mlflow run` cases are e2e too.)"""
import mlflow
import pytest

from gradshare.contract.tags import FAILURE, REFUSAL
from gradshare.tracking import connection
from tests.conftest import mlflow_run_as_typed as _mlflow_run

pytestmark = pytest.mark.e2e


def test_with_an_experiment_name_a_bad_machine_rank_is_a_failed_refusal_naming_the_ranks(mlflow_server):
    """The plugin is not asked where the command names its experiment: MLflow makes the run, and
    the entry point's check ends it as a refusal that says which ranks there are."""
    proc = _mlflow_run("-e", "train", "--env-manager", "local", "--experiment-name", "rank-typo",
                       "-P", "study=rank-typo", "-P", "arm=dense", "-P", "machine_rank=-1")
    assert proc.returncode != 0
    [run] = connection.client().search_runs([mlflow.get_experiment_by_name("rank-typo").experiment_id])
    # the parser ends it KILLED, a refusal; `mlflow run` leaves it so (MLflow 3.17's check for an ended
    # run is broken: the plugin mends it in every `mlflow run`, tracking.mlflow_run_keeps_the_steps_end)
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true"
    assert "machine_rank=-1" in run.data.tags[FAILURE] and "0..0" in run.data.tags[FAILURE]
