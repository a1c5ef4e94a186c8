"""A user's first day (issue 23): a step on a study that does not exist creates nothing; a
refusal ends KILLED and a failure FAILED, each with its reason first, in one line; the
traceback of an unexpected error goes to its run, not the terminal. (Under MLflow's launcher,
and `gradshare project` and `analyze` on a study: tests/e2e/test_first_day_study.py.)"""
import subprocess
import sys

import mlflow
import pytest

from tests.conftest import REPO, experiment_id, run_entry
from gradshare.contract.tags import FAILURE, INTERRUPTED, REFUSAL
from gradshare.tracking import connection
from gradshare.tracking import study_runs


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("step, args", [("commit", ()), ("score", ()), ("analyze", ()),
                                        ("train", ("--arm", "single"))])
def test_a_step_on_an_unknown_study_says_so_in_one_line_and_creates_nothing(mlflow_server, step, args):
    before = {e.name for e in connection.client().search_experiments()}
    proc = run_entry(step, "--study", "nosuchstudy", *args, check=False)
    assert proc.returncode != 0 and not proc.stdout
    [line] = _lines(proc.stderr)
    assert line.startswith("[gradshare] no study 'nosuchstudy' in ") and "run prepare first" in line, line
    assert mlflow.get_experiment_by_name("nosuchstudy") is None
    assert {e.name for e in connection.client().search_experiments()} == before


def test_project_on_an_unknown_study_says_so_in_one_line_and_creates_nothing(mlflow_server):
    proc = subprocess.run([sys.executable, "-m", "entrypoints.cli", "project", "--study", "nosuchstudy"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not proc.stdout
    [line] = _lines(proc.stderr)
    assert line.startswith("[gradshare] no study 'nosuchstudy' in ") and "run prepare first" in line, line
    assert mlflow.get_experiment_by_name("nosuchstudy") is None


def _step_that_raises(study: str, raised: str) -> subprocess.CompletedProcess:
    """A step's run (`tracking.study_run`, as every entry point opens it) whose work raises."""
    code = ("from gradshare.contract.errors import Refusal\n"
            "from gradshare.tracking import study_runs\n"
            f"with study_runs.study_run({study!r}, 'analyze', run_name='analyze'):\n"
            f"    raise {raised}\n")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_step_stopped_from_outside_says_so_in_one_line_and_leaves_no_traceback(mlflow_server, tmp_path):
    """An interruption (SIGTERM, Ctrl-C: `Interrupted`, a KeyboardInterrupt) is not an unexpected
    error: one line with how far the step got, its run KILLED `interrupted`, no traceback printed
    or stored (writing one once failed mid-stop and printed it: test_faults_round4's case 4)."""
    study = "first-day-stopped"
    experiment_id(study)
    proc = _step_that_raises(study, "KeyboardInterrupt('stopped by signal SIGTERM; last completed update 4 of 8')")
    assert proc.returncode == 1
    assert _lines(proc.stderr) == ["[gradshare] analyze interrupted: interrupted: stopped by signal SIGTERM; last "
                                   "completed update 4 of 8"], proc.stderr
    assert "Traceback" not in proc.stderr
    [run] = study_runs.search(study, "analyze")
    assert run.info.status == "KILLED" and run.data.tags[INTERRUPTED] == "true" and REFUSAL not in run.data.tags
    assert not [a for a in connection.client().list_artifacts(run.info.run_id, "failure")]


def test_an_unexpected_error_prints_its_reason_first_and_leaves_its_traceback_on_the_run(mlflow_server, tmp_path):
    study = "first-day"
    experiment_id(study)
    proc = _step_that_raises(study, "ZeroDivisionError('planted: 1/0')")
    assert proc.returncode == 1
    lines = _lines(proc.stderr)
    assert lines[0] == "[gradshare] analyze FAILED: ZeroDivisionError: planted: 1/0", proc.stderr
    assert lines[1].startswith(f"[gradshare] its traceback: {study_runs.TRACEBACK} of run ") and len(lines) == 2, lines
    assert "Traceback" not in proc.stderr
    [run] = study_runs.search(study, "analyze")
    assert run.info.status == "FAILED" and run.info.run_id in lines[1] and REFUSAL not in run.data.tags
    assert run.data.tags[FAILURE] == "ZeroDivisionError: planted: 1/0"
    text = study_runs.download(run.info.run_id, study_runs.TRACEBACK, tmp_path).read_text()
    assert text.startswith("Traceback (most recent call last):") and "ZeroDivisionError: planted: 1/0" in text


def test_a_refusal_ends_killed_with_its_reason_and_no_traceback(mlflow_server):
    """KILLED, MLflow's other terminal status, is how the runs table tells a refusal (nothing was
    attempted) from a failure at a glance; the reason and the refusal tag stay."""
    study = "first-day-refusal"
    experiment_id(study)
    proc = _step_that_raises(study, "Refusal('planted: already done')")
    assert proc.returncode == 1
    assert _lines(proc.stderr) == ["[gradshare] analyze refused: planted: already done"]
    [run] = study_runs.search(study, "analyze")
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true"
    assert run.data.tags[FAILURE] == "planted: already done" and run.data.tags["mlflow.runName"] == "refused-analyze"
    assert not connection.client().list_artifacts(run.info.run_id, "failure")


def test_a_step_in_an_empty_folder_creates_no_store(tmp_path):
    """No MLFLOW_TRACKING_URI and no mlflow.db here: the refusal names the store it looked for, and
    creates neither the database nor MLflow's migration lines (issue 44: it made mlflow.db)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "entrypoints.train", "--study", "nosuchstudy", "--arm", "single"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0 and not proc.stdout
    [line] = _lines(proc.stderr)
    assert line == (f"[gradshare] no study 'nosuchstudy' in sqlite:///mlflow.db: there is no store at "
                    f"{tmp_path.resolve() / 'mlflow.db'}; run prepare first (`gradshare prepare --study "
                    f"nosuchstudy`); nothing was done"), line
    assert not (tmp_path / "mlflow.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
