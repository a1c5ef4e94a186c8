"""A step's last words name the fault it met: a server that stopped answering under it (and
what running it again does), or a store that answers but refused a record; one line each."""
from __future__ import annotations

import mlflow
import pytest

from gradshare.contract.errors import StudyError
from gradshare.contract.tags import FAILURE
from gradshare.tracking import connection, outbox, study_runs


def _stderr_lines(capsys) -> list[str]:
    """gradshare's lines on stderr (MLflow's own log lines aside); no traceback among the rest."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("[gradshare]")]


def test_a_commit_whose_server_is_killed_mid_step_says_so_and_that_commit_again_is_safe(tmp_path, monkeypatch,
                                                                                        capsys):
    """The fault seen: the server SIGKILLed while commit downloads a checkpoint's files; the step
    printed MLflow's 'Failed to download artifacts from path generation_config.json' and nothing
    else. Now one line: the server stopped answering during commit, running commit again is safe,
    and where the run's end waits; `gradshare upload` delivers that end (FAILED, the same reason)
    once the server is back."""
    from tests.conftest import MlflowServer

    monkeypatch.setenv(outbox.ENV, str(tmp_path / "outbox"))
    server = MlflowServer(tmp_path / "server").start()
    before = mlflow.get_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    try:
        study = "commit-server-killed"
        mlflow.set_tracking_uri(server.uri)
        exp = connection.client().create_experiment(study)
        with pytest.raises(SystemExit):
            with study_runs.study_run(study, "commit", run_name="commit") as run:
                run_id = run.info.run_id
                server.stop()  # SIGKILL, every process of it
                with outbox.fast_fail():  # the request commit was making: a real error of MLflow's client
                    mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="generation_config.json",
                                                        dst_path=str(tmp_path / "dl"))
        lines = _stderr_lines(capsys)
        kept = tmp_path / "outbox" / run_id
        assert len(lines) == 1, lines
        [line] = lines
        assert line.startswith("[gradshare] commit FAILED: tracking: the tracking server") and \
            "stopped answering during commit" in line, line
        assert "running `commit` again is safe" in line and f"gradshare upload {kept}" in line, line
        assert "Failed to download" not in line

        server.start()  # back, on the same port and store
        assert outbox.upload([kept], log=lambda _: None) == 0
        got = connection.client().get_run(run_id)
        assert got.info.status == "FAILED" and "running `commit` again is safe" in got.data.tags[FAILURE]
        assert got.info.experiment_id == exp
    finally:
        server.stop()
        mlflow.set_tracking_uri(before)


def test_a_store_that_answers_but_refused_a_record_is_not_called_a_server_that_does_not_answer(
        mlflow_server, tmp_path, monkeypatch, capsys):
    """The fault seen: a full artifact store printed a second line, 'the tracking server does not
    answer'. Records that wait behind one the store refused, while the server answers, are told
    as the store's refusal; and where the step's own line already named the outbox (as the arm's
    'artifact store refused the trained checkpoint ... gradshare upload DIR' does), nothing more."""
    monkeypatch.setenv(outbox.ENV, str(tmp_path / "outbox"))
    study = "store-refused-messages"
    study_runs.setup(study, create=True)
    for said_the_dir in (False, True):
        with pytest.raises(SystemExit):
            with study_runs.study_run(study, "train", arm="single", run_name="train-single") as run:
                box = outbox.Outbox(run.info.run_id, grace_s=0)
                box.hold()  # as after the store refused the checkpoint: what follows waits in the journal,
                box.metrics({"x": 1.0}, step=1)
                box.end("FINISHED")  # the arm's end among it (an upload completes the arm)
                where = f"; kept in {box.dir}: `gradshare upload {box.dir}`" if said_the_dir else ""
                raise StudyError(f"the artifact store refused the trained checkpoint (full){where}")
        lines = _stderr_lines(capsys)
        assert not any("does not answer" in line for line in lines), lines
        assert lines[0].startswith("[gradshare] train single FAILED: the artifact store refused"), lines
        if said_the_dir:
            assert len(lines) == 1, lines
        else:
            assert len(lines) == 2 and lines[1].startswith(
                "[gradshare] the tracking store refused a record of this run: 2 records, the run's end among "
                f"them, wait behind it in {box.dir}"), lines
        assert outbox.Outbox(run.info.run_id, grace_s=0).pending() == 2  # kept for `gradshare upload`


def test_a_server_gone_when_a_finished_step_ends_says_the_server_does_not_answer(tmp_path, monkeypatch, capsys):
    """The other fault, told as itself: the step's work is done, the server is gone when its run
    ends: one line, the server does not answer, where the end waits."""
    from tests.conftest import MlflowServer

    monkeypatch.setenv(outbox.ENV, str(tmp_path / "outbox"))
    server = MlflowServer(tmp_path / "server").start()
    before = mlflow.get_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    try:
        study = "server-gone-at-the-end"
        mlflow.set_tracking_uri(server.uri)
        connection.client().create_experiment(study)
        with pytest.raises(SystemExit):
            with study_runs.study_run(study, "analyze", run_name="analyze") as run:
                server.stop()
        [line] = _stderr_lines(capsys)
        kept = tmp_path / "outbox" / run.info.run_id
        assert line.startswith("[gradshare] the tracking server does not answer (") and \
            f"the run's end (FINISHED) and 1 records wait in {kept}" in line, line
    finally:
        server.stop()
        mlflow.set_tracking_uri(before)
