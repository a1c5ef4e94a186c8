"""Faults injected for real that FAULTS.md lists and no other module covers: a whole arm
stopped with SIGTERM, or with Ctrl-C (SIGINT to its process group), ends FAILED with the
reason and the last completed update, and leaves no worker process behind. Faults of the
environment never cost the arm its attempt or its weights: a disk without room for the
checkpoint is refused before the claim, naming the bytes; a full artifact store after the
last update leaves the weights in the outbox for `gradshare upload`; a launcher killed after
the workers finished leaves the arm FINISHED. The small disks are real tmpfs mounts (the
suite runs as root)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gradshare.contract import metrics as M
from gradshare.contract.tags import ATTEMPT, CKPT_SHA, FAILURE, INTERRUPTED, REFUSAL, STEP
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import REPO, overrides, run_entry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stopped_study(mlflow_server):
    study = "sigterm-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "2"}))
    return study


def _stop_after_three_updates(study: str, arm: str, stop) -> tuple[object, str]:
    """Start the arm (updates slowed), call `stop(proc)` once it has logged three updates;
    returns its run and output once it has ended. Slowed to 3 s an update: the stop must land
    before the 8th update ends, and seeing the third logged (the outbox's send, this loop's
    search) can lag by seconds on a loaded machine; five updates of 3 s leave 15 s for that."""
    proc = subprocess.Popen([sys.executable, "-m", "entrypoints.train", "--study", study, "--arm", arm],
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", "GRADSHARE_INJECT_SLOW_S": "3"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while True:  # until three updates are logged
        runs = study_runs.search(study, "train", arm)
        if runs and len(connection.client().get_metric_history(runs[0].info.run_id, M.STEP_S)) >= 3:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the arm never logged three updates"
        time.sleep(0.3)
    stop(proc)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-3000:]
    [run] = study_runs.search(study, "train", arm)
    return run, out


def _check_stopped(run, words: str) -> None:
    """Stopped from outside: KILLED, `interrupted: ...` with the last update, no attempt used
    (`claims.decide_train`), nothing left running."""
    assert run.info.status == "KILLED" and run.data.tags[INTERRUPTED] == "true" and REFUSAL not in run.data.tags
    reason = run.data.tags[FAILURE]
    assert reason.startswith(f"interrupted: {words}; last completed update "), reason
    last = int(re.search(r"last completed update (\d+) of 8", reason).group(1))
    logged = max(m.step for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert 3 <= last == logged < 8
    left = [p for p in psutil.process_iter(["cmdline"]) if run.info.run_id in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]


def test_sigterm_to_an_arm_ends_it_killed_interrupted_with_its_last_update_and_no_process_left(stopped_study):
    run, _ = _stop_after_three_updates(stopped_study, "dense", lambda proc: proc.send_signal(signal.SIGTERM))
    _check_stopped(run, "stopped by signal SIGTERM")


def test_ctrl_c_to_an_arm_ends_it_killed_interrupted_with_its_last_update_and_no_process_left(stopped_study):
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group (the step, its
    launcher and whichever ranks share the group) at once."""
    run, _ = _stop_after_three_updates(stopped_study, "powersgd", lambda proc: os.killpg(proc.pid, signal.SIGINT))
    _check_stopped(run, "stopped by the user (interrupt)")


def _tmpfs(path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return made.returncode == 0, made.stderr.strip()


def test_a_disk_without_room_for_the_checkpoint_is_refused_before_the_claim_naming_the_bytes(
        mlflow_server, tmp_path):
    """The outbox, where rank 0 writes the final checkpoint, on a 1 MiB disk: refused before
    any update and before the attempt is claimed, with the bytes needed and free."""
    import json
    import math

    study = "small-outbox-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}))
    disk = tmp_path / "tiny-disk"
    ok, why = _tmpfs(disk, "1m")
    assert ok, f"no tmpfs here (the suite runs as root): {why}"
    try:
        proc = run_entry("train", "--study", study, "--arm", "single", check=False,
                         env={"GRADSHARE_OUTBOX": str(disk / "outbox")})
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    assert proc.returncode != 0
    [run] = study_runs.search(study, "train", "single")
    reason = run.data.tags[FAILURE]
    assert run.data.tags[REFUSAL] == "true" and ATTEMPT not in run.data.tags, reason
    free, need = (int(x.replace(",", "")) for x in re.search(r"has ([\d,]+) bytes free.*needs ([\d,]+)", reason).groups())
    shapes = json.loads(study_runs.read_text(study_runs.prepare_run(study).info.run_id, "model_shapes.json"))["shapes"]
    assert need == int(sum(math.prod(s) for s in shapes) * 4 * 1.05) + 64 * 2**20  # FP32 weights and slack
    assert free <= 2**20
    assert not connection.client().get_metric_history(run.info.run_id, M.STEP_S)  # not one update


def test_a_full_artifact_store_after_the_last_update_keeps_the_weights_and_upload_completes_the_arm(tmp_path):
    """A server of its own whose artifact store (a tmpfs) is full once the study is prepared:
    the arm trains every update, the store refuses the checkpoint, the weights stay in the
    run's outbox and the run says how to finish; with room made, `gradshare upload` completes
    the arm FINISHED with the checkpoint the run's hash names."""
    import mlflow

    from gradshare.util.hashing import checkpoint_sha256
    from tests.conftest import MlflowServer

    store = tmp_path / "server" / "artifacts"
    ok, why = _tmpfs(store, "64m")
    assert ok, f"no tmpfs here (the suite runs as root): {why}"
    server = None
    try:
        server = MlflowServer(tmp_path / "server").start()
        env = {"MLFLOW_TRACKING_URI": server.uri, "GRADSHARE_OUTBOX": str(tmp_path / "outbox")}
        c = mlflow.MlflowClient(tracking_uri=server.uri)
        study = "full-store-study"
        run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}), env=env)
        filler = store / "filler"
        with open(filler, "wb") as fh:  # all but 256 KiB: the run's small records fit, its weights do not
            fh.write(b"\0" * (shutil.disk_usage(store).free - 256 * 1024))
        proc = run_entry("train", "--study", study, "--arm", "single", check=False, env=env)
        assert proc.returncode != 0
        exp = c.get_experiment_by_name(study)
        [run] = c.search_runs([exp.experiment_id], f"tags.`{STEP}` = 'train'")
        reason = run.data.tags[FAILURE]
        kept = tmp_path / "outbox" / run.info.run_id
        assert run.info.status == "FAILED" and "the artifact store refused the trained checkpoint" in reason, reason
        assert f"gradshare upload {kept}" in reason and "MlflowException" in reason, reason  # the store's answer
        assert len(c.get_metric_history(run.info.run_id, M.STEP_S)) == 8  # every update trained
        # one line names the fault, and it is the store's: no word of a server that does not answer
        told = [line for line in proc.stderr.splitlines() if f"gradshare upload {kept}" in line]
        assert len(told) == 1 and "does not answer" not in proc.stderr, proc.stderr[-3000:]
        weights = kept / "checkpoint" / "model.safetensors"
        assert weights.stat().st_size > 256 * 1024
        kept_bytes = weights.read_bytes()
        filler.unlink()  # room made
        up = subprocess.run([sys.executable, "-m", "entrypoints.cli", "upload", str(kept)], cwd=REPO,
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        run = c.get_run(run.info.run_id)
        assert run.info.status == "FINISHED" and FAILURE not in run.data.tags
        got = tmp_path / "got"
        got.mkdir()
        path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="checkpoint",
                                                   dst_path=str(got), tracking_uri=server.uri)
        assert checkpoint_sha256(path) == run.data.tags[CKPT_SHA]
        assert (Path(path) / "model.safetensors").read_bytes() == kept_bytes
        assert not kept.exists()  # the store has it all: the outbox's copy is removed
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["umount", str(store)], capture_output=True)


def test_a_launcher_killed_after_the_workers_finish_leaves_the_arm_finished(stopped_study):
    """The train step SIGKILLed once rank 0 has written the final checkpoint
    (`GRADSHARE_INJECT_KILL_LAUNCHER`): the worker records the result and ends the run itself."""
    proc = run_entry("train", "--study", stopped_study, "--arm", "single", check=False,
                     env={"GRADSHARE_INJECT_KILL_LAUNCHER": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    # run_entry returned at the end of its output: every worker had exited by then
    [run] = study_runs.search(stopped_study, "train", "single")
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags, run.data.tags.get(FAILURE)
    assert CKPT_SHA in run.data.tags
    assert [a.path for a in connection.client().list_artifacts(run.info.run_id) if a.path == "checkpoint"]
    assert len(connection.client().get_metric_history(run.info.run_id, M.STEP_S)) == 8
    left = [p for p in psutil.process_iter(["cmdline"]) if run.info.run_id in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
