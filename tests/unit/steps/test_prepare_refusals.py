"""`prepare` refuses a plan that cannot run: its run ends FAILED with the reason. (Prepared
studies: tests/e2e/test_prepare.py.)"""
from gradshare.contract.tags import FAILURE
from gradshare.tracking import connection, study_runs
from tests.conftest import run_entry


def test_an_impossible_plan_fails_the_prepare_run_with_the_reason(mlflow_server):
    proc = run_entry("prepare", "--study", "impossible", "--arms.rows", "single:single:1,dense:dense:3,powersgd:powersgd:2", check=False)
    assert proc.returncode != 0
    [run] = study_runs.search("impossible", "prepare")
    assert run.info.status == "FAILED"
    assert "dense's 3 processes (arms.rows)" in run.data.tags[FAILURE]


def test_a_row_of_an_unknown_kind_fails_the_prepare_run_naming_the_known_kinds(mlflow_server):
    """A kind the table does not hold (`gradshare.kinds.table`) is refused at prepare, by name,
    before anything is built: never taken for DDP."""
    proc = run_entry("prepare", "--study", "unknown-kind", "--arms.rows", "single:single:1,t:topk:2",
                     "--arms.candidate", "single", "--arms.controls", "single", check=False)
    assert proc.returncode != 0
    [run] = study_runs.search("unknown-kind", "prepare")
    assert run.info.status == "FAILED"
    assert "kind 'topk' is not one of single, dense, powersgd, fp16" in run.data.tags[FAILURE]
    # nothing was built: the run keeps its failure's details alone
    assert [a.path for a in connection.client().list_artifacts(run.info.run_id)] == ["failure"]
