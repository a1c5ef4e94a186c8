"""A user's first day (issue 23), the parts that go through MLflow's launcher or a prepared study:
a step refused under `mlflow.projects.run` stays KILLED; `gradshare project` and `analyze` on
a study print no progress bars and no warnings. (The rest: tests/unit/entrypoints/test_first_day.py.)"""
import subprocess
import sys

import mlflow
import pytest

from tests.conftest import REPO, run_entry
from gradshare.contract.tags import FAILURE, REFUSAL
from gradshare.tracking import connection

pytestmark = pytest.mark.e2e


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _launched_with_a_bad_rank(study: str, keep_the_steps_end: bool):
    """The train step with machine_rank=-1, launched in a process of its own by MLflow's launcher
    (`mlflow.projects.run`, as `gradshare study` and `mlflow run` launch every step)."""
    code = ("import mlflow\n"
            "from mlflow.exceptions import ExecutionException\n"
            "from gradshare.tracking import connection\n"
            + ("connection.mlflow_run_keeps_the_steps_end()\n" if keep_the_steps_end else "") +
            "try:\n"
            f"    mlflow.projects.run({str(REPO)!r}, entry_point='train', env_manager='local', synchronous=True,\n"
            f"                        experiment_name={study!r}, parameters={{'study': {study!r}, 'arm': 'dense',\n"
            "                                                            'machine_rank': '-1'})\n"
            "except ExecutionException:\n"
            "    pass\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = connection.client().search_runs([mlflow.get_experiment_by_name(study).experiment_id])
    assert run.data.tags[REFUSAL] == "true" and "machine_rank=-1" in run.data.tags[FAILURE]
    return run


def test_a_step_refused_under_mlflows_launcher_stays_killed(mlflow_server):
    """The parser ends the launcher's run KILLED; the launcher then ends any run FAILED after a
    non-zero exit, its already-ended check being broken in MLflow 3.17 (a status string given to
    `RunStatus.is_terminated`, which takes an int). Where the launcher's process has
    `tracking.mlflow_run_keeps_the_steps_end`, the refusal stays KILLED. (Should MLflow fix its
    check, the first assertion fails: then the workaround can go.)"""
    assert _launched_with_a_bad_rank("launched-unfixed", keep_the_steps_end=False).info.status == "FAILED"
    assert _launched_with_a_bad_rank("launched-fixed", keep_the_steps_end=True).info.status == "KILLED"


def test_project_on_a_study_draws_no_progress_bars(prepared_study):
    """`gradshare project --study` reads the study's plan (an artifact download: MLflow draws a
    bar for each) and builds the full profile's inputs (tokenizer, conversations): no bar, no
    warning, whatever arms the study has finished so far."""
    proc = subprocess.run([sys.executable, "-m", "entrypoints.cli", "project", "--study", prepared_study,
                           "--hosts", "2,4"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## The study's hosts, a projection" in proc.stdout
    assert not _lines(proc.stderr), proc.stderr[-3000:]


def test_analyze_of_a_study_without_finished_arms_warns_nothing(failing_study):
    """An uncommitted study: no scores and no arm's histories, so every plot is empty; matplotlib
    warned once per empty legend (five "No artists with labels found to put in legend")."""
    proc = run_entry("analyze", "--study", failing_study)
    assert "quality screen: NULL" in proc.stdout
    assert not [line for line in proc.stderr.splitlines() if "Warning" in line], proc.stderr[-3000:]
