"""Faults injected for real that FAULTS.md lists and no other module covers: a whole arm
stopped with SIGTERM, or with Ctrl-C (SIGINT to its process group), ends FAILED with the reason and the last completed update, and leaves
no worker process behind; a disk that fills while the checkpoint is written fails the arm
with that reason, and nothing partial is taken for a checkpoint (a real tmpfs; skipped
with the reason where none can be mounted)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from gradshare import metrics as M
from gradshare import tracking as T
from tests.conftest import REPO, overrides, run_entry


@pytest.fixture(scope="module")
def stopped_study(mlflow_server):
    study = "sigterm-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "2"}))
    return study


def _stop_after_three_updates(study: str, arm: str, stop) -> tuple[object, str]:
    """Start the arm (updates slowed), call `stop(proc)` once it has logged three updates;
    returns its run and output once it has ended."""
    proc = subprocess.Popen([sys.executable, "-m", "entrypoints.train", "--study", study, "--arm", arm],
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", "GRADSHARE_INJECT_SLOW_S": "1.5"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while True:  # until three updates are logged
        runs = T.search(study, "train", arm)
        if runs and len(T.client().get_metric_history(runs[0].info.run_id, M.STEP_S)) >= 3:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the arm never logged three updates"
        time.sleep(0.3)
    stop(proc)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-3000:]
    [run] = T.search(study, "train", arm)
    return run, out


def _check_stopped(run, words: str) -> None:
    assert run.info.status == "FAILED"
    reason = run.data.tags[T.FAILURE]
    assert reason.startswith(f"{words}; last completed update "), reason
    last = int(re.search(r"last completed update (\d+) of 8", reason).group(1))
    logged = max(m.step for m in T.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert 3 <= last == logged < 8
    left = [p for p in psutil.process_iter(["cmdline"]) if run.info.run_id in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]


def test_sigterm_to_an_arm_ends_it_failed_with_its_last_update_and_no_process_left(stopped_study):
    run, _ = _stop_after_three_updates(stopped_study, "dense", lambda proc: proc.send_signal(signal.SIGTERM))
    _check_stopped(run, "stopped by signal SIGTERM")


def test_ctrl_c_to_an_arm_ends_it_failed_with_its_last_update_and_no_process_left(stopped_study):
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group (the step, its
    launcher and whichever ranks share the group) at once."""
    run, _ = _stop_after_three_updates(stopped_study, "powersgd", lambda proc: os.killpg(proc.pid, signal.SIGINT))
    _check_stopped(run, "stopped by the user (interrupt)")


def _tmpfs(path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return made.returncode == 0, made.stderr.strip()


def test_a_full_disk_while_writing_the_checkpoint_fails_the_arm_and_no_partial_checkpoint_is_taken(
        mlflow_server, tmp_path):
    study = "full-disk-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}))
    # room for the verified inputs (the seed model among them), not for them and the checkpoint
    [prep] = T.search(study, "prepare")
    inputs = sum(f.file_size or 0 for f in _walk(prep.info.run_id, "inputs"))
    disk = tmp_path / "small-disk"
    ok, why = _tmpfs(disk, f"{int(inputs * 1.25) // 1024 + 64}k")
    if not ok:
        pytest.skip(f"no tmpfs here: {why}")
    try:
        proc = run_entry("train", "--study", study, "--arm", "single", check=False, env={"TMPDIR": str(disk)})
        assert proc.returncode != 0
        [run] = T.search(study, "train", "single")
        assert run.info.status == "FAILED"
        assert "No space left on device" in run.data.tags[T.FAILURE], run.data.tags[T.FAILURE]
        # every update trained: the disk filled while the step-8 checkpoint was written
        assert len(T.client().get_metric_history(run.info.run_id, M.STEP_S)) == 8
        assert T.CKPT_SHA not in run.data.tags  # nothing was taken for a checkpoint
        assert not [a for a in T.client().list_artifacts(run.info.run_id) if a.path == "checkpoint"]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def _walk(run_id: str, path: str) -> list:
    out = []
    for a in T.client().list_artifacts(run_id, path):
        out += _walk(run_id, a.path) if a.is_dir else [a]
    return out


def test_every_row_of_faults_md_names_tests_that_exist():
    """FAULTS.md's last column: `tests/file.py::test_name` (or `...::test_name`, the same file as
    the name before it, or a whole `tests/file.py`); each must be a test in the suite."""
    rows = [line for line in (REPO / "FAULTS.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| fault ", "|---"))]
    assert len(rows) >= 40
    for row in rows:
        cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        names = re.findall(r"`([^`]+)`", cell)
        assert names, f"no test named in: {row[:80]}"
        current = None
        for name in names:
            path, _, test = name.partition("::")
            current = REPO / path if path != "..." else current
            assert current is not None and current.is_file(), f"{name}: no such file ({row[:60]})"
            if test:
                assert re.search(rf"^def {re.escape(test)}\(", current.read_text(), re.M), \
                    f"{name}: no such test in {current.name}"
