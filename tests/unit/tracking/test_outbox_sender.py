"""An arm's outbox sends from a process of its own (`gradshare.tracking.sender`), against a real
tracking server: the training process only appends, so no request and no MLflow code runs in
the interpreter that launches the GPU's work (a sending thread there cost the loop the
interpreter between its kernel launches). Every record arrives once, in order; the sending
process ends with the arm, also when the arm is killed; a real error of the store stops the
arm at its next grace check, naming it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from gradshare.contract import metrics as M
from gradshare.tracking import connection, outbox
from tests.conftest import REPO, experiment_id

APPENDER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from gradshare.tracking.outbox import Outbox
    run_id, directory, n, then = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    box = Outbox(run_id, 600, directory=directory, background=True)
    print(json.dumps({"sender": box._sender.pid}), flush=True)
    for u in range(1, n + 1):
        box.metrics({"train/loss": 1.0 / u, "perf/step_s": 0.1}, step=u)
    deadline = time.monotonic() + 60
    while box.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"pending": box.pending(), "mlflow_imported": "mlflow" in sys.modules}), flush=True)
    if then == "hang":
        time.sleep(3600)
    box.close()
""")


@pytest.fixture
def run_id(mlflow_server):
    """A run of this module's experiment, ended after the test (a RUNNING run left in the shared
    store would read as a step still running to every later test)."""
    rid = connection.client().create_run(experiment_id("outbox-sender")).info.run_id
    yield rid
    if connection.client().get_run(rid).info.lifecycle_stage == "active":
        connection.client().set_terminated(rid, "FINISHED")


def _appender(run_id: str, directory, n: int, then: str = "close") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", APPENDER, run_id, str(directory), str(n), then], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_arms_records_arrive_from_another_process_and_none_runs_in_the_arms(run_id, tmp_path):
    proc = _appender(run_id, tmp_path / "box", 60)
    out, _ = proc.communicate(timeout=120)
    lines = [json.loads(x) for x in out.splitlines()]
    assert proc.returncode == 0
    assert lines[1] == {"pending": 0, "mlflow_imported": False}
    history = sorted((m.step, m.value) for m in connection.client().get_metric_history(run_id, "train/loss"))
    assert history == [(u, 1.0 / u) for u in range(1, 61)]  # every update once, in order
    assert not psutil.pid_exists(lines[0]["sender"]) or \
        psutil.Process(lines[0]["sender"]).status() == psutil.STATUS_ZOMBIE


def test_several_updates_metrics_go_in_one_request_up_to_mlflows_limit(tmp_path):
    box = outbox.Outbox("0" * 32, grace_s=60, directory=tmp_path)
    box.hold()  # journal only: nothing is sent in this test
    for u in range(1, 201):
        box.metrics({f"m{k}": float(k) for k in range(9)}, step=u)  # 9 metrics per update
    box.params({"a": 1})
    box.metrics({"after": 1.0}, step=201)
    first = box._batch_from(0)
    assert len(first) == 1000 // 9 and sum(len(r["values"]) for r in first) <= outbox.MAX_METRICS_PER_REQUEST
    assert [r["step"] for r in first] == list(range(1, 112))
    assert len(box._batch_from(199)) == 1  # a params record ends a batch
    assert box._batch_from(200) == [box._records[200]] and box._records[200]["kind"] == "params"


def test_the_sending_process_ends_with_a_killed_arm(run_id, tmp_path):
    proc = _appender(run_id, tmp_path / "box", 5, then="hang")
    sender = json.loads(proc.stdout.readline())["sender"]
    json.loads(proc.stdout.readline())  # delivered
    assert psutil.pid_exists(sender)
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up in the arm: its sender must notice by itself
    proc.wait()
    deadline = time.monotonic() + 15
    while psutil.pid_exists(sender) and psutil.Process(sender).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the sending process outlived its arm"
        time.sleep(0.1)


def test_a_real_error_of_the_store_stops_the_arm_at_its_next_grace_check(run_id, tmp_path):
    client = connection.client()
    client.set_terminated(run_id, "KILLED")
    client.delete_run(run_id)  # the server answers, and refuses: not a lost server
    box = outbox.Outbox(run_id, grace_s=600, directory=tmp_path / "box", log=lambda line: None, background=True)
    try:
        box.metrics({M.STEP_S: 0.1}, step=1)
        deadline = time.monotonic() + 60
        with pytest.raises(outbox.SendingStopped) as err:
            while time.monotonic() < deadline:
                box.check_grace("after update 1")
                time.sleep(0.1)
        assert str(err.value).startswith("tracking: ") and f"gradshare upload {tmp_path / 'box' / run_id}" in str(err.value)
        assert box.pending() == 1  # kept for the upload
    finally:
        box.close()
