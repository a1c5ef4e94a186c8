"""`prepare` refuses a plan that cannot run: its run ends FAILED with the reason. (Prepared
studies: tests/e2e/test_prepare.py.)"""
from gradshare.contract.tags import FAILURE
from gradshare.tracking import study_runs
from tests.conftest import run_entry


def test_an_impossible_plan_fails_the_prepare_run_with_the_reason(mlflow_server):
    proc = run_entry("prepare", "--study", "impossible", "--arms.dense_processes", "3", check=False)
    assert proc.returncode != 0
    [run] = study_runs.search("impossible", "prepare")
    assert run.info.status == "FAILED"
    assert "arms.dense_processes=3" in run.data.tags[FAILURE]
