"""Faults injected for real that FAULTS.md lists and no other module covers: a whole arm
stopped with SIGTERM ends FAILED with the reason and the last completed update, and leaves
no worker process behind."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil

from gradshare import metrics as M
from gradshare import tracking as T
from tests.conftest import REPO, overrides, run_entry


def test_sigterm_to_an_arm_ends_it_failed_with_its_last_update_and_no_process_left(mlflow_server):
    study = "sigterm-study"
    run_entry("prepare", "--study", study, *overrides())
    proc = subprocess.Popen([sys.executable, "-m", "entrypoints.train", "--study", study, "--arm", "dense"],
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", "GRADSHARE_INJECT_SLOW_S": "1.5"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while True:  # until three updates are logged
        runs = T.search(study, "train", "dense")
        if runs and len(T.client().get_metric_history(runs[0].info.run_id, M.STEP_S)) >= 3:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the arm never logged three updates"
        time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-3000:]
    [run] = T.search(study, "train", "dense")
    assert run.info.status == "FAILED"
    reason = run.data.tags[T.FAILURE]
    assert reason.startswith("stopped by signal SIGTERM; last completed update "), reason
    last = int(re.search(r"last completed update (\d+) of 8", reason).group(1))
    logged = max(m.step for m in T.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert 3 <= last == logged < 8
    left = [p for p in psutil.process_iter(["cmdline"]) if run.info.run_id in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
