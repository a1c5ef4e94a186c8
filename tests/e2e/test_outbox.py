"""The tracking server lost in the middle of an arm, for real (its processes killed and
started again on the same port and store, or frozen with SIGSTOP): records wait on local disk and reach the server
when it returns within the grace time; past it the arm stops after a whole update with
everything kept, and `gradshare upload` delivers it later. Nothing is lost either way."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import mlflow
import psutil
import pytest

from gradshare.contract import metrics as M
from gradshare.tracking import outbox
from gradshare.train.resume import latest_full_state
from gradshare.contract.tags import CKPT_SHA, FAILURE
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import REPO, MlflowServer, experiment_id, overrides, run_entry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def lone_server(tmp_path_factory):
    """A tracking server of this module's own (the session's server must never go away); each
    test leaves it running."""
    server = MlflowServer(tmp_path_factory.mktemp("lone-server")).start()
    old = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = server.uri
    mlflow.set_tracking_uri(server.uri)
    yield server
    server.stop()
    mlflow.set_tracking_uri(old[0])
    os.environ["MLFLOW_TRACKING_URI"] = old[1] or ""
    if old[1] is None:
        del os.environ["MLFLOW_TRACKING_URI"]


def _history(run_id: str, key: str = M.STEP_S) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in connection.client().get_metric_history(run_id, key))


def test_records_wait_while_the_server_is_gone_and_arrive_in_order_when_it_returns(lone_server, tmp_path):
    run = connection.client().create_run(experiment_id("outbox-unit"))
    box = outbox.Outbox(run.info.run_id, grace_s=600, directory=tmp_path / "box", log=lambda line: None)
    box.metrics({"loss": 1.0}, step=1)
    assert box.pending() == 0
    lone_server.stop()
    t0 = time.monotonic()
    for u in (2, 3, 4):
        box.metrics({"loss": float(u)}, step=u)  # no exception, no minutes of client retries
    artifact = tmp_path / "note.txt"
    artifact.write_text("kept while the server was gone")
    box.artifacts(artifact, "notes")
    artifact.unlink()  # the arm's working directory does not outlive it: the outbox keeps a copy
    assert time.monotonic() - t0 < 30
    assert box.pending() == 4 and 0 < box.lost_for() < 60
    box.check_grace("during the test")  # within the grace: no stop
    lone_server.start()
    box.metrics({"loss": 5.0}, step=5)  # the next record finds the server again ...
    assert box.deliver(force=True)  # ... or the next try does (tries are spaced while it is lost)
    assert box.pending() == 0 and box.lost_for() == 0
    assert _history(run.info.run_id, "loss") == [(u, float(u)) for u in range(1, 6)]
    assert study_runs.download(run.info.run_id, "notes/note.txt", tmp_path / "dl").read_text() == \
        "kept while the server was gone"


def test_past_the_grace_time_the_journal_is_uploaded_by_the_documented_command(lone_server, tmp_path):
    run = connection.client().create_run(experiment_id("outbox-unit"))
    box = outbox.Outbox(run.info.run_id, grace_s=1, directory=tmp_path / "box", log=lambda line: None)
    lone_server.stop()
    box.metrics({"loss": 2.0}, step=1)
    box.end("FAILED", {FAILURE: "tracking: planted"})
    time.sleep(1.5)
    with pytest.raises(outbox.ServerLost, match=r"did not answer for \d+s \(arms.tracking_grace_s 1\).*"
                                                r"gradshare upload .*box/"):
        box.check_grace("after update 1")
    lone_server.start()
    cmd = [sys.executable, "-m", "entrypoints.cli", "upload", str(tmp_path / "box")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=os.environ | {})
    assert out.returncode == 0, out.stderr
    assert f"run {run.info.run_id}: 2 records delivered" in out.stdout
    done = connection.client().get_run(run.info.run_id)
    assert done.info.status == "FAILED" and done.data.tags[FAILURE] == "tracking: planted"
    assert _history(run.info.run_id, "loss") == [(1, 2.0)]
    assert not (tmp_path / "box" / run.info.run_id).exists()  # ended and delivered: its outbox removed
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)  # sent at most once
    assert again.returncode == 0 and _history(run.info.run_id, "loss") == [(1, 2.0)]


def _train(study: str, arm: str, box_dir, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "entrypoints.train", "--study", study, "--arm", arm, *args],
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", outbox.ENV: str(box_dir), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_updates(proc, study: str, arm: str, n: int) -> str:
    deadline = time.monotonic() + 300
    while True:
        runs = study_runs.search(study, "train", arm)
        if runs and len(connection.client().get_metric_history(runs[0].info.run_id, M.STEP_S)) >= n:
            return runs[0].info.run_id
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"the arm never logged {n} updates"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def lost_study(lone_server):
    study = "outbox-study"
    # 16 updates of 4 documents (the small study's 64), a 20 s grace
    run_entry("prepare", "--study", study, *overrides({
        "model.pretrain_steps": "1", "schedule.updates": "16", "schedule.docs_per_update": "4",
        "arms.tracking_grace_s": "20"}))
    return study


def test_an_arm_keeps_training_while_the_server_hangs_and_every_update_arrives(lone_server, lost_study, tmp_path):
    proc = _train(lost_study, "dense", tmp_path / "box", {"GRADSHARE_INJECT_SLOW_S": "1.5"})
    run_id = _wait_for_updates(proc, lost_study, "dense", 2)
    lone_server.freeze()  # hung: a request waits 10 s for nothing, then the records wait
    # until the outbox has found the server lost (its mark, written once a request timed out):
    # on a loaded machine that can be later than a fixed sleep; updates go on meanwhile
    lost_mark = tmp_path / "box" / run_id / "lost_since"
    deadline = time.monotonic() + 120
    while not lost_mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the outbox never found the server lost"
        time.sleep(0.2)
    time.sleep(2)
    lone_server.freeze(False)  # the server answers again inside the 20 s grace
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-4000:]
    assert "does not answer: records wait in" in out and "kept while it was gone are delivered" in out
    run = connection.client().get_run(run_id)
    assert run.info.status == "FINISHED" and CKPT_SHA in run.data.tags
    assert [s for s, _ in _history(run_id)] == list(range(1, 17))  # every update once, none twice
    assert len(_history(run_id, M.TRAIN_LOSS)) == 16
    assert not (tmp_path / "box" / run_id).exists()  # all delivered: the journal is not kept


def test_past_the_grace_an_arm_stops_after_a_whole_update_and_upload_delivers_everything(
        lone_server, lost_study, tmp_path):
    box_dir = tmp_path / "box"
    # 3 s per update at least: the 20 s grace runs out well before update 16
    proc = _train(lost_study, "powersgd", box_dir, {"GRADSHARE_INJECT_SLOW_S": "3"}, "--full-state-every", "2")
    run_id = _wait_for_updates(proc, lost_study, "powersgd", 2)
    lone_server.stop()
    out = proc.communicate(timeout=600)[0]  # the server never returns while the arm runs
    assert proc.returncode != 0
    assert f"deliver them with `gradshare upload {box_dir / run_id}`" in out, out[-4000:]
    left = [p for p in psutil.process_iter(["cmdline"]) if run_id in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
    journal = [json.loads(line) for line in (box_dir / run_id / outbox.JOURNAL).read_text().splitlines()]
    trained = max(r["step"] for r in journal if r["kind"] == "metrics" and M.STEP_S in r["values"])
    assert 2 < trained < 16 and journal[-1]["kind"] == "end" and journal[-1]["status"] == "FAILED"

    lone_server.start()
    assert connection.client().get_run(run_id).info.status == "RUNNING"  # until the journal is delivered
    up = subprocess.run([sys.executable, "-m", "entrypoints.cli", "upload", str(box_dir)], cwd=REPO,
                        capture_output=True, text=True)
    assert up.returncode == 0, up.stdout + up.stderr
    run = connection.client().get_run(run_id)
    assert run.info.status == "FAILED"
    reason = run.data.tags[FAILURE]
    assert re.match(r"tracking: the tracking server http://127\.0\.0\.1:\d+ did not answer for \d+s "
                    r"\(arms\.tracking_grace_s 20\), after update \d+ of 16", reason), reason
    assert int(re.search(r"after update (\d+)", reason).group(1)) == trained
    assert [s for s, _ in _history(run_id)] == list(range(1, trained + 1))
    # the full states saved while the server was gone are in the store, whole: resumable
    assert latest_full_state(run_id) == f"full_state/u{(trained // 2) * 2:05d}"
