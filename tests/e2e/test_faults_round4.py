"""Faults, round four (issue 44), on two emulated hosts where the fault needs them: each test
injects one fault for real and asserts the one line, the statuses, whether an attempt was used,
that the weights are kept, and that nothing of the arm is left running. (A link partitioned
inside and past its bound: tests/e2e/test_partition.py.)

Skipped with the reason where namespaces cannot be made (not root, no `ip`/`tc`).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gradshare.contract import metrics as M
from gradshare.contract.tags import ATTEMPT, CKPT_SHA, FAILURE, INTERRUPTED, REFUSAL
from gradshare.hosts import netns
from gradshare.steps.emulated import run_arm_across
from gradshare.tracking import connection, study_runs
from gradshare.util.hashing import checkpoint_sha256
from tests.conftest import REPO, overrides, run_entry

pytestmark = pytest.mark.e2e

REASON = netns.unavailable()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts here: {REASON}")

RATE_MBIT = 22.0  # the tiny profile's link
# the small plan with a seed pre-trained one step, not twelve: no test here reads the seed's
# quality, and each step is about 0.6 CPU-s of every prepare
PLAN = {"model.pretrain_steps": "1"}


def _left(study: str) -> list:
    return [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any(study in part for part in (p.info["cmdline"] or []))]


def _upload(box: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "entrypoints.cli", "upload", str(box)], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=600)


@needs_hosts
def test_case1_a_rank_killed_on_host_1_after_the_checkpoint_leaves_the_arm_finished_with_its_weights_in_the_store(
        mlflow_server, monkeypatch, tmp_path):
    """Rank 1, on host 1, SIGKILLed once rank 0 on host 0 has written the final checkpoint into
    the run's outbox. The arm is whole: it ends FINISHED (at once, or after `gradshare upload` of
    the outbox where the weights waited), its one attempt, and the store's checkpoint hashes to
    what rank 0 recorded of the outbox copy. No upload ever removes weights the store lacks."""
    study = "round4-kill-after-ckpt"
    run_entry("prepare", "--study", study, *overrides(PLAN))
    box_root = tmp_path / "outbox"
    monkeypatch.setenv("GRADSHARE_OUTBOX", str(box_root))
    monkeypatch.setenv("GRADSHARE_INJECT_KILL_AFTER_CHECKPOINT", "1")
    ok = run_arm_across(study, "dense", RATE_MBIT, timeout_s=900)
    [run] = study_runs.search(study, "train", "dense")
    box = box_root / run.info.run_id
    if run.info.status != "FINISHED":  # the weights wait in the outbox, and the line says how to send them
        reason = run.data.tags.get(FAILURE, "")
        assert f"gradshare upload {box}" in reason, reason
        assert (box / "checkpoint" / "model.safetensors").exists()
        up = _upload(box)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        [run] = study_runs.search(study, "train", "dense")
    assert ok or run.info.status == "FINISHED"
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags, run.data.tags.get(FAILURE)
    assert run.data.tags[ATTEMPT] == "1" and REFUSAL not in run.data.tags
    steps = sorted(m.step for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert steps == list(range(1, 9))
    stored = study_runs.download(run.info.run_id, "checkpoint", tmp_path / "stored")
    assert checkpoint_sha256(stored) == run.data.tags[CKPT_SHA]  # rank 0's hash of the outbox copy
    # host 1's own run: FAILED, and its reason says why (its rank was killed), host first
    [host1] = study_runs.search(study, "train-host", "dense")
    assert host1.info.status == "FAILED", host1.info.status
    assert host1.data.tags[FAILURE].startswith("host 1: arm dense: rank 1 on host emulated-host-1 was killed by "
                                               "SIGKILL"), host1.data.tags[FAILURE]
    assert not box.exists()  # delivered: the outbox copy went only once the store held the same bytes
    assert not _left(study)
    assert not [n for n in netns.leftovers() if n.startswith(f"gradshare-{os.getpid()}x")]


def _study_command(study: str, *extra: str) -> list[str]:
    """The README's first command for `study`, small: two arms over loopback, the smoke profile."""
    cmd = [sys.executable, "-m", "mlflow", "run", str(REPO), "-e", "study", "--env-manager", "local",
           "-P", f"study={study}", "-P", "profile=smoke", "-P", "hosts=loopback", *extra]
    for k, v in {"model.pretrain_steps": "2", "arms.rows": "single:single:1,dense:dense:2",
                 "arms.candidate": "dense", "arms.controls": "single"}.items():
        cmd += ["-P", f"{k}={v}"]
    return cmd


def test_case4_sigterm_to_mlflow_run_study_stops_every_step_killed_interrupted_and_a_rerun_continues(mlflow_server,
                                                                                                     tmp_path):
    """SIGTERM to `mlflow run . -e study` (only to it: its own session) while the dense arm trains:
    every process of the study ends within a minute; the arm's run and the study's run end KILLED
    `interrupted: ...`, nothing RUNNING; the same command again continues: prepare and single are
    not run again, dense trains as attempt 2 (the interrupted one used none of max_attempts 1),
    and the study is committed, scored and analyzed."""
    study = "round4-interrupted"
    scratch = tmp_path / "tmp"  # the study's TMPDIR, every step's: counted at the end
    scratch.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")},
           "PYTHONUNBUFFERED": "1", "GRADSHARE_INJECT_SLOW_S": "1", "TMPDIR": str(scratch)}
    proc = subprocess.Popen(_study_command(study, "-P", "new_study=true"), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while True:  # until dense has two updates in the store
        runs = study_runs.search(study, "train", "dense")
        if runs and len(connection.client().get_metric_history(runs[0].info.run_id, M.STEP_S)) >= 2:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "dense never logged two updates"
        time.sleep(0.3)
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0 and time.monotonic() - t_stop < 60, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not _left(study), _left(study)
    [dense] = study_runs.search(study, "train", "dense")
    assert dense.info.status == "KILLED" and dense.data.tags[INTERRUPTED] == "true", dense.info.status
    assert re.match(r"interrupted: stopped by signal SIGTERM; last completed update [2-7] of 8$",
                    dense.data.tags[FAILURE]), dense.data.tags[FAILURE]
    [launcher] = study_runs.search(study, "study")
    assert launcher.info.status == "KILLED" and launcher.data.tags[INTERRUPTED] == "true"
    assert launcher.data.tags[FAILURE].startswith("interrupted: stopped by signal SIGTERM; run the study again")
    exp = connection.client().get_experiment_by_name(study)
    assert not connection.client().search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
    # the same command again, without new_study: it continues where it stopped
    again = subprocess.run(_study_command(study), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "prepare: done already" in again.stdout and "train arm=single: done already" in again.stdout
    assert len(study_runs.search(study, "prepare")) == 1 and len(study_runs.search(study, "train", "single")) == 1
    stopped, trained = study_runs.search(study, "train", "dense")
    assert stopped.info.run_id == dense.info.run_id and trained.info.status == "FINISHED"
    assert trained.data.tags[ATTEMPT] == "2"
    for step in ("commit", "score", "analyze"):  # score's nested runs (one per arm) included
        statuses = [r.info.status for r in study_runs.search(study, step)]
        assert statuses and set(statuses) == {"FINISHED"}, (step, statuses)
    assert not _left(study)
    # every folder a step made under TMPDIR is gone, the interrupted ones' too. Not ours: MLflow's
    # launcher leaves an empty `tmp*` folder per `mlflow run` (for path parameters), and torch keeps
    # its compile cache, `torchinductor_<user>`, across runs on purpose
    left = [p.name for p in scratch.iterdir() if not (p.name.startswith("tmp") and p.is_dir() and not any(p.iterdir()))
            and not p.name.startswith("torchinductor_")]
    assert left == [], left


@needs_hosts
def test_case3_a_1_mbit_link_refuses_the_two_host_arm_before_any_update_naming_the_rate(mlflow_server):
    """A link far too slow for the arm (1 Mbit/s: dense's 6 MB exchange would take 48 s an update,
    past the 30 s hang bound) is refused by the probe before the first update: KILLED, a refusal
    naming the measured rate, on both hosts' runs; no attempt used (the arm's next claim is
    attempt 1); nothing left running."""
    from gradshare.tracking import claims, store

    study = "round4-slow-link"
    run_entry("prepare", "--study", study, *overrides(PLAN))
    t0 = time.monotonic()
    assert not run_arm_across(study, "dense", 1.0, timeout_s=600)
    took = time.monotonic() - t0
    [run] = study_runs.search(study, "train", "dense")
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true"
    reason = run.data.tags[FAILURE]
    m = re.match(r"link: the link to the other host carries (\d+\.\d+) Mbit/s \(a probe before the arm\); arm "
                 r"dense's largest update sends (\d+\.\d+) MB a rank, (\d+) s at that rate, past the 30 s", reason)
    assert m, reason
    mbit, mb, s = float(m.group(1)), float(m.group(2)), int(m.group(3))
    assert 0.7 <= mbit <= 1.05 and s == pytest.approx(mb * 8 / mbit, abs=1) and s > 30, reason
    assert "no attempt used" in reason and M.STEP_S not in run.data.metrics  # not one update
    [host1] = study_runs.search(study, "train-host", "dense")
    assert host1.info.status == "KILLED" and host1.data.tags[REFUSAL] == "true"
    assert host1.data.tags[FAILURE].startswith("host 1: link: the link to the other host carries ")
    prep, _ = store.prepared_plan(study)
    assert claims.decide_train(claims.entries(prep.info.run_id), "dense", max_attempts=1) == 1
    assert took < 300, took  # refused at start-up, not at the hang bound or the time limit
    assert not _left(study)


def test_case6_a_commit_killed_holding_its_commitment_is_void_and_the_next_commit_makes_no_second_unavailable_runs(
        mlflow_server):
    """A commit SIGKILLed once its commitment.json is stored (no arm trained: all three
    unavailable) leaves a RUNNING run holding the file. The next commit's sweep ends it FAILED,
    tagged `gradshare.commitment_void`, its reason saying the file seals nothing; that commit
    seals the study, reusing the three unavailable runs (three in all, not six)."""
    from gradshare.contract.tags import COMMITMENT_VOID
    from gradshare.tracking import store

    study = "round4-void-commit"
    run_entry("prepare", "--study", study, *overrides(PLAN))
    killed = run_entry("commit", "--study", study, env={"GRADSHARE_INJECT_KILL_AFTER_COMMITMENT": "1"}, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    [first] = study_runs.search(study, "commit")
    assert first.info.status == "RUNNING"
    void = json.loads(study_runs.read_text(first.info.run_id, "commitment.json"))
    run_entry("commit", "--study", study)
    first = connection.client().get_run(first.info.run_id)
    assert first.info.status == "FAILED" and first.data.tags[COMMITMENT_VOID] == "true"
    assert first.data.tags[FAILURE].startswith(f"orphaned: commit run {first.info.run_id}; its process ")
    assert first.data.tags[FAILURE].endswith("; its commitment.json is void: the commit did not finish, and the "
                                             "study's next commit seals it")
    run, sealed = store.commitment(study)
    assert run.info.run_id != first.info.run_id and run.info.status == "FINISHED"
    assert COMMITMENT_VOID not in run.data.tags
    unavailable = [r for arm in ("single", "dense", "powersgd") for r in study_runs.search(study, "train", arm)]
    assert len(unavailable) == 3 and all(r.data.tags["mlflow.runName"].endswith("-unavailable") for r in unavailable)
    assert {a["arm"]: a["run_id"] for a in sealed["arms"]} == {a["arm"]: a["run_id"] for a in void["arms"]}


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no tmpfs here (not root?): {made.stderr.strip()}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_case5_a_disk_that_fills_during_prepare_is_one_line_naming_it_and_prepares_nothing(mlflow_server, tmp_path):
    """TMPDIR on a 3 MiB tmpfs: prepare's inputs (the seed model alone is 5.8 MB) fill it. One
    line naming the disk's folder, no traceback; the run FAILED with it; no prepared study."""
    scratch = tmp_path / "small"
    _tmpfs(scratch, "3m")
    try:
        study = "round4-disk-full"
        proc = run_entry("prepare", "--study", study, *overrides(PLAN), env={"TMPDIR": str(scratch)}, check=False)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        said = [line for line in proc.stderr.splitlines() if line.startswith("[gradshare] prepare FAILED: ")]
        assert len(said) == 1, proc.stderr[-3000:]
        assert re.match(rf"\[gradshare\] prepare FAILED: disk: the disk of {re.escape(str(scratch))}/\S+ is full \(\d[\d,]* "
                        r"bytes free\) while prepare built the study's inputs \(.*No space left on device.*\): free space "
                        r"there, or point TMPDIR at a larger disk; nothing was prepared$", said[0]), said[0]
        [run] = study_runs.search(study, "prepare")
        assert run.info.status == "FAILED" and run.data.tags[FAILURE] == said[0].split("FAILED: ", 1)[1]
        # its scratch removed (torch's own compile cache, `torchinductor_<user>`, is kept on purpose)
        assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []
    finally:
        _umount(scratch)


def test_case5_a_store_that_fills_during_prepare_is_one_line_and_keeps_no_partial_inputs(tmp_path):
    """A server of its own whose artifact store (a 1 MiB tmpfs) cannot take the study's inputs:
    one line naming the store's refusal, no traceback; the run FAILED with it and holds no
    artifact (what the store had taken is removed, and said)."""
    import mlflow

    from tests.conftest import MlflowServer

    store = tmp_path / "server" / "artifacts"
    _tmpfs(store, "1m")
    server = None
    try:
        server = MlflowServer(tmp_path / "server").start()
        env = {"MLFLOW_TRACKING_URI": server.uri}
        study = "round4-store-full"
        proc = run_entry("prepare", "--study", study, *overrides(PLAN), env=env, check=False)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        said = [line for line in proc.stderr.splitlines() if line.startswith("[gradshare] prepare FAILED: ")]
        assert len(said) == 1, proc.stderr[-3000:]
        assert said[0].startswith("[gradshare] prepare FAILED: store: the artifact store refused the study's inputs (")
        assert re.search(r"; the [\d,]+ bytes of them it had taken were removed; nothing was prepared: make room in "
                         r"the store and prepare again$", said[0]), said[0]
        c = mlflow.MlflowClient(tracking_uri=server.uri)
        [run] = c.search_runs([c.get_experiment_by_name(study).experiment_id])
        assert run.info.status == "FAILED" and run.data.tags[FAILURE].startswith("store: ")
        assert c.list_artifacts(run.info.run_id) == []
    finally:
        if server is not None:
            server.stop()
        _umount(store)
