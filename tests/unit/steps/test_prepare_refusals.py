"""`prepare` refuses a plan that cannot run: its run ends FAILED with the reason. (Prepared
studies: tests/e2e/test_prepare.py.)"""
from gradshare.contract.tags import FAILURE
from gradshare.tracking import study_runs
from tests.conftest import run_entry


def test_an_impossible_plan_fails_the_prepare_run_with_the_reason(mlflow_server):
    proc = run_entry("prepare", "--study", "impossible", "--arms.rows", "single:single:1,dense:dense:3,powersgd:powersgd:2", check=False)
    assert proc.returncode != 0
    [run] = study_runs.search("impossible", "prepare")
    assert run.info.status == "FAILED"
    assert "dense's 3 processes (arms.rows)" in run.data.tags[FAILURE]
