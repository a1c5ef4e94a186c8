"""Names made from input never reach outside the run's artifact directory, in the store or on
local disk: a study name, an arm named in a commitment, a manifest's file path, an artifact
path in an outbox journal. Each is refused, naming it, before anything is read or written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pytest

from gradshare.tracking import outbox
from gradshare.tracking import store
from gradshare.contract.errors import StudyError
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import REPO, experiment_id

ESCAPES = ["../outside", "/etc/passwd", "a/../../outside", "a\\..\\outside", "", "a\x00b", "./a", "a//b"]


@pytest.mark.parametrize("name", ESCAPES)
def test_an_artifact_path_that_could_leave_the_run_is_refused(name):
    with pytest.raises(StudyError, match="is not allowed"):
        connection.safe_artifact_path(name)


@pytest.mark.parametrize("name", ["checkpoint", "full_state/u00004", "per_case/test.jsonl", "inputs/seed_model"])
def test_the_studys_own_artifact_paths_pass(name):
    assert connection.safe_artifact_path(name) == name


@pytest.mark.parametrize("study", ["../../tmp/evil", "a/b", "with space", ".hidden", "x" * 200])
def test_a_study_name_that_could_name_a_path_is_refused_before_any_run(mlflow_server, study):
    before = {r.info.run_id for r in mlflow.search_runs(search_all_experiments=True, output_format="list")}
    proc = subprocess.run([sys.executable, "-m", "entrypoints.prepare", "--study", study], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode != 0 and "is not allowed: use 1-128 letters, digits" in proc.stderr, proc.stderr[-2000:]
    after = {r.info.run_id for r in mlflow.search_runs(search_all_experiments=True, output_format="list")}
    assert after == before and mlflow.get_experiment_by_name(study) is None


def test_a_download_outside_its_directory_is_refused_and_writes_nothing(mlflow_server, tmp_path):
    run = connection.client().create_run(experiment_id("artifact-names"))
    connection.client().log_text(run.info.run_id, "inside", "notes/inside.txt")
    connection.client().set_terminated(run.info.run_id, "FINISHED")  # no test after this one meets it RUNNING
    dst = tmp_path / "a" / "b"
    with pytest.raises(StudyError, match="'../../notes' is not allowed"):
        study_runs.download(run.info.run_id, "../../notes", dst)
    assert not dst.exists() and sorted(p.name for p in tmp_path.rglob("*")) == []
    assert study_runs.download(run.info.run_id, "notes/inside.txt", dst).read_text() == "inside"


def test_a_commitment_naming_an_arm_outside_the_download_root_is_refused(tmp_path):
    commitment = {"arms": [{"arm": "../../outside", "status": "FINISHED", "run_id": "0" * 32,
                            "checkpoint_sha256": "0" * 64}]}
    with pytest.raises(StudyError, match="'../../outside' is not allowed"):
        store.verified_checkpoints(commitment, tmp_path / "root")
    assert not (tmp_path / "outside").exists()


def test_an_outbox_record_that_would_leave_the_run_is_refused_and_not_journaled(tmp_path):
    box = outbox.Outbox("0" * 32, grace_s=60, directory=tmp_path)
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(StudyError):
        box.artifacts(f, "../../elsewhere")
    with pytest.raises(StudyError):
        box.text("x", "/etc/cron.d/job")
    assert box.pending() == 0 and not (tmp_path / ("0" * 32) / outbox.JOURNAL).exists()


def test_a_manifest_path_that_leaves_the_inputs_is_refused(mlflow_server, tmp_path):
    """A prepare run whose manifest (hashes and all consistent) names `../../x`: the train
    inputs are refused before any file is fetched or read."""
    from gradshare.util.hashing import tree_sha256
    from gradshare.contract.plan import load_plan

    plan = load_plan("tiny")
    files = [{"path": "tokenizer/../../../outside", "bytes": 1, "sha256": "0" * 64}]
    manifest = {"plan_sha256": plan.sha256(), "files": files, "inputs_sha256": tree_sha256(files),
                "seed_model": {"kind": "tiny-pretrained"}}
    run = connection.client().create_run(experiment_id("artifact-names-manifest"), tags={"gradshare.inputs_sha256": manifest["inputs_sha256"]})
    connection.client().log_text(run.info.run_id, json.dumps(manifest), "inputs/manifest.json")
    connection.client().set_terminated(run.info.run_id, "FINISHED")
    with pytest.raises(StudyError, match="'tokenizer/../../../outside' is not allowed"):
        store.verified_inputs(connection.client().get_run(run.info.run_id), plan, tmp_path / "work")
    assert not (tmp_path / "outside").exists()
