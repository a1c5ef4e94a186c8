"""Faults, round three, injected for real through the train entry point (FAULTS.md):

- a rank stopped (SIGSTOP) ends the arm within `arms.stall_s`, far below its time limit, naming
  that rank, its host and the last completed update (the one its metrics show), no process left;
- the launcher (`accelerate launch`) SIGKILLed mid-arm: its workers go on, watched, and the arm
  completes FINISHED with every update;
- a rank SIGKILLed after the checkpoint is written: the arm is FINISHED, its weights in the store;
- a rank stopped in teardown, after rank 0 wrote the arm's result: the stall bound stops the arm,
  which is FINISHED all the same, within the bound, no process left;
- a file of the arm's working directory changed after launch: a refusal naming the file, KILLED,
  no attempt used (the arm then trains as attempt 1).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from gradshare.contract import metrics as M
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ATTEMPT, CKPT_SHA, FAILURE, REFUSAL
from gradshare.tracking import connection, study_runs
from tests.conftest import REPO, overrides, run_entry

pytestmark = pytest.mark.e2e

BOUNDS = {"arms.stall_s": "8", "arms.hang_updates": "6", "model.pretrain_steps": "1"}


@pytest.fixture(scope="module")
def round3_study(mlflow_server):
    study = "faults-round3"
    run_entry("prepare", "--study", study, *overrides(BOUNDS))
    return study


def _train(study: str, arm: str, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "entrypoints.train", "--study", study, "--arm", arm], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, capture_output=True, text=True,
                          timeout=900)
    return proc, time.monotonic() - t0


def _left(run_id: str) -> list:
    return [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if run_id in " ".join(p.info["cmdline"] or [])]


def _logged(run_id: str) -> list[int]:
    return sorted(m.step for m in connection.client().get_metric_history(run_id, M.STEP_S))


def test_a_stopped_rank_ends_the_arm_within_the_stall_bound_named(round3_study):
    proc, _ = _train(round3_study, "dense", {"GRADSHARE_INJECT_STOP_AT": "3:1", "GRADSHARE_INJECT_SLOW_S": "0.5"})
    assert proc.returncode != 0
    [run] = study_runs.search(round3_study, "train", "dense")
    assert run.info.status == "FAILED"
    reason = run.data.tags[FAILURE]
    assert re.match(r"stalled: arm dense: rank 1 on host \S+ made no progress for \d+ s \(stopped or hung: its "
                    r"process has not run for \d+ s, arms.stall_s 8\)", reason), reason
    last = int(re.search(r"last completed update (\d+) of 8", reason).group(1))
    assert last == max(_logged(run.info.run_id)) == 2  # the same record as the step metrics
    # the stall bound ended it, long before the arm's time limit would have: the product's own figures
    silent = int(re.search(r"made no progress for (\d+) s", reason).group(1))
    stopped = int(re.search(r"has not run for (\d+) s", reason).group(1))
    assert 8 <= stopped <= silent < load_plan("tiny", dict(BOUNDS)).arms.timeout_s(8), reason
    assert _left(run.info.run_id) == []
    assert run.data.tags.get(ATTEMPT) == "1"  # a stopped rank is the arm's failure: its attempt is used


def test_a_launcher_killed_mid_arm_leaves_its_workers_to_complete_the_arm(round3_study):
    proc, _ = _train(round3_study, "single", {"GRADSHARE_INJECT_KILL_AGENT_AT": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"the launcher ended with code -9 while 1 worker\(s\) run on", proc.stderr), proc.stderr[-3000:]
    [run] = study_runs.search(round3_study, "train", "single")
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags
    assert _logged(run.info.run_id) == list(range(1, 9)) and CKPT_SHA in run.data.tags
    assert _left(run.info.run_id) == []


def test_a_rank_killed_after_the_checkpoint_leaves_the_arm_finished_with_its_weights(round3_study):
    proc, _ = _train(round3_study, "powersgd", {"GRADSHARE_INJECT_KILL_AFTER_CHECKPOINT": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = study_runs.search(round3_study, "train", "powersgd")
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags, run.data.tags.get(FAILURE)
    assert CKPT_SHA in run.data.tags
    names = {a.path for a in connection.client().list_artifacts(run.info.run_id, "checkpoint")}
    assert "checkpoint/model.safetensors" in names
    assert _logged(run.info.run_id) == list(range(1, 9))
    assert _left(run.info.run_id) == []


def test_a_rank_hung_in_teardown_after_the_result_leaves_the_arm_finished(mlflow_server):
    study = "faults-round3-teardown"  # its own: the study above has used dense's attempt
    run_entry("prepare", "--study", study, *overrides(BOUNDS))
    proc, _ = _train(study, "dense", {"GRADSHARE_INJECT_STOP_AFTER_RESULT": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"arm dense: the arm was stopped \(stalled: arm dense: rank 1 .*\) after every update and the "
                     r"checkpoint were done: the arm is recorded whole", proc.stderr), proc.stderr[-3000:]
    [run] = study_runs.search(study, "train", "dense")
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags, run.data.tags.get(FAILURE)
    assert CKPT_SHA in run.data.tags and _logged(run.info.run_id) == list(range(1, 9))
    # the stall bound ended it (the line above names it), not the arm's time limit
    assert _left(run.info.run_id) == []


def test_a_workdir_file_changed_after_launch_is_a_refusal_naming_it_and_uses_no_attempt(mlflow_server):
    study = "faults-round3-workdir"
    run_entry("prepare", "--study", study, *overrides(BOUNDS))
    proc, _ = _train(study, "single", {"GRADSHARE_INJECT_CORRUPT": "plan.json"})
    assert proc.returncode != 0
    [refused] = study_runs.search(study, "train", "single")
    assert refused.info.status == "KILLED" and refused.data.tags.get(REFUSAL) == "true"
    reason = refused.data.tags[FAILURE]
    assert re.match(r"workdir: \S+/plan\.json changed after the arm's launch \(", reason), reason
    assert reason.endswith("nothing was trained, no attempt used: train again")
    proc, _ = _train(study, "single", {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = [r for r in study_runs.search(study, "train", "single") if r.info.status == "FINISHED"]
    assert len(ok) == 1 and ok[0].data.tags.get(ATTEMPT) == "1"
