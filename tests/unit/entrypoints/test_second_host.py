"""The second host's train step (machine rank 1): the run `mlflow run` makes for it says what
it is, and a clock behind the study's is refused on it as on every step's run."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from gradshare.contract.tags import FAILURE, REFUSAL, RUN_NAME, STEP
from gradshare.tracking import connection
from tests.conftest import REPO

# host B's step with its workers left out (they need rank 0): everything before them runs for real
HOST_B = ("import entrypoints.train as t; import gradshare.steps.train as st; "
          "st.run_secondary_host = lambda *a: print('workers started'); "
          "t.main(['--study', {study!r}, '--arm', 'dense', '--num-machines', '2', '--machine-rank', '1', "
          "'--main-process-ip', '127.0.0.1', '--main-process-port', '29555'])")


def _host_b(study: str, launcher: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HOST_B.format(study=study)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "MLFLOW_RUN_ID": launcher})


def test_the_second_hosts_launcher_run_is_named_for_its_arm_and_host(mlflow_server):
    c = connection.client()
    exp = c.create_experiment("second-host-name")
    launcher = c.create_run(exp).info.run_id  # as `mlflow run` makes it: a random name
    proc = _host_b("second-host-name", launcher)
    assert proc.returncode == 0 and "workers started" in proc.stdout, proc.stderr[-2000:]
    tags = c.get_run(launcher).data.tags
    assert tags[RUN_NAME] == "train-dense-host1" and tags[STEP] == "train-host"


def test_the_second_host_on_a_clock_behind_the_studys_is_refused_on_its_launcher_run(mlflow_server):
    """Host B's clock 600 s behind the study's last record (host A's run, stamped by its clock):
    its run ends KILLED, named `refused-train-dense-host1`, tagged a refusal with the skew; no
    worker starts."""
    c = connection.client()
    exp = c.create_experiment("second-host-clock")
    c.create_run(exp, start_time=int((time.time() + 600) * 1000), tags={STEP: "train", RUN_NAME: "train-dense"})
    launcher = c.create_run(exp).info.run_id
    proc = _host_b("second-host-clock", launcher)
    assert proc.returncode == 1 and "workers started" not in proc.stdout
    run = c.get_run(launcher)
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true"
    assert run.data.tags[RUN_NAME] == "refused-train-dense-host1"
    reason = run.data.tags[FAILURE]
    assert reason.startswith("clock: ") and " s before the study's last record (the start of run train-dense" in reason
    assert proc.stderr.strip().splitlines()[-1] == f"[gradshare] train host 1 refused: {reason}"


def test_the_second_hosts_failure_is_its_runs_reason(mlflow_server):
    """Host B's workers fail (here: the arm's error as the driver raises it): its launcher run carries
    the reason, naming the host, where it once ended FAILED with no reason tag (issue 44)."""
    c = connection.client()
    exp = c.create_experiment("second-host-fails")
    launcher = c.create_run(exp).info.run_id
    failing = HOST_B.replace("lambda *a: print('workers started')",
                             "(lambda *a: (_ for _ in ()).throw(__import__('gradshare.contract.errors', "
                             "fromlist=['StudyError']).StudyError('stalled: arm dense: rank 0 on host a made no "
                             "progress for 40 s')))")
    proc = subprocess.run([sys.executable, "-c", failing.format(study="second-host-fails")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "MLFLOW_RUN_ID": launcher})
    assert proc.returncode == 1
    reason = c.get_run(launcher).data.tags[FAILURE]
    assert reason == "host 1: stalled: arm dense: rank 0 on host a made no progress for 40 s"
    assert proc.stderr.strip().splitlines()[-1] == f"[gradshare] train host 1 FAILED: {reason[len('host 1: '):]}"
