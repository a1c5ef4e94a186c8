"""`gradshare upload` leaves no copy behind: an ended run's outbox, once the store has every
record, is removed; a run that may still append keeps its folder."""
from __future__ import annotations

import os
import subprocess
import sys

from gradshare.tracking import connection, outbox
from tests.conftest import REPO


def _held(box_dir, weights) -> tuple[str, outbox.Outbox]:
    """A run whose records wait in its outbox, the weights copied beside the journal (as after a
    lost server or a full store)."""
    run = connection.client().create_run(connection.client().create_experiment(f"delivered-{weights.stem}"))
    box = outbox.Outbox(run.info.run_id, grace_s=0, directory=box_dir, log=lambda line: None)
    box.hold()
    box.metrics({"train/loss": 1.5}, step=1)
    box.artifacts(weights, "checkpoint")
    return run.info.run_id, box


def test_upload_removes_an_ended_runs_delivered_outbox_and_keeps_one_that_may_still_append(mlflow_server,
                                                                                          tmp_path):
    box_dir = tmp_path / "box"
    ended_w, open_w = tmp_path / "ended.bin", tmp_path / "open.bin"
    ended_w.write_bytes(b"\1" * 3_000_000)
    open_w.write_bytes(b"\2" * 1_000)
    ended, box = _held(box_dir, ended_w)
    box.end("FINISHED")
    still, _ = _held(box_dir, open_w)  # no end: its arm may still be writing
    assert (box_dir / ended / "files").is_dir() and (box_dir / still / "files").is_dir()

    up = subprocess.run([sys.executable, "-m", "entrypoints.cli", "upload", str(box_dir)], cwd=REPO,
                        capture_output=True, text=True, timeout=300, env=os.environ | {})
    assert up.returncode == 0, up.stdout + up.stderr
    assert not (box_dir / ended).exists()
    [line] = [x for x in up.stdout.splitlines() if "is removed" in x]
    assert line.startswith(f"[gradshare] run {ended}: every record is in the store; its outbox {box_dir / ended} "
                           f"is removed (3,0"), line
    assert (box_dir / still / "files").is_dir()  # delivered, but not ended: left alone
    c = connection.client()
    assert c.get_run(ended).info.status == "FINISHED"
    assert [a.path for a in c.list_artifacts(ended, "checkpoint")] == ["checkpoint/ended.bin"]
    assert c.get_run(still).info.status == "RUNNING"


def _checkpoint(folder, value: float) -> None:
    """A saved model's files as the arm writes them: safetensors weights and a config."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.full((64, 64), value)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "by-hand"}')


def _ended_with_checkpoint(box_dir, name: str, value: float, recorded: str | None, deliver: bool) -> str:
    """An ended run whose outbox holds a checkpoint: journaled as the arm's result (`deliver`, with
    the weights hash `recorded`), or only written there (a rank killed before the record)."""
    from gradshare.contract.tags import CKPT_SHA

    c = connection.client()
    run_id = c.create_run(c.create_experiment(f"weights-{name}")).info.run_id
    box = outbox.Outbox(run_id, grace_s=0, directory=box_dir, log=lambda line: None)
    box.hold()
    box.metrics({"train/loss": 1.5}, step=1)
    _checkpoint(box.dir / "checkpoint", value)
    if deliver:
        box.tags({CKPT_SHA: recorded})
        box.journal(box.dir / "checkpoint", "checkpoint")
    box.end("FINISHED" if deliver else "FAILED")
    return run_id


def test_upload_never_removes_weights_the_store_does_not_hold_byte_for_byte(mlflow_server, tmp_path):
    """A rank killed after rank 0 wrote the checkpoint into the outbox, before any record named it:
    `gradshare upload` delivered the rest and once removed the folder, the only copy of the weights.
    Now a folder goes only where the store lists the same files and records the same weights hash."""
    from gradshare.util.hashing import checkpoint_sha256

    box_dir = tmp_path / "box"
    _checkpoint(tmp_path / "same", 0.5)
    right = checkpoint_sha256(tmp_path / "same")
    unnamed = _ended_with_checkpoint(box_dir, "unnamed", 0.5, None, deliver=False)
    stored = _ended_with_checkpoint(box_dir, "stored", 0.5, right, deliver=True)
    wrong = _ended_with_checkpoint(box_dir, "wrong", 0.5, "0" * 64, deliver=True)
    up = subprocess.run([sys.executable, "-m", "entrypoints.cli", "upload", str(box_dir)], cwd=REPO,
                        capture_output=True, text=True, timeout=300, env=os.environ | {})
    assert up.returncode == 0, up.stdout + up.stderr
    size = sum(f.stat().st_size for f in (box_dir / unnamed / "checkpoint").iterdir())
    assert (f"[gradshare] run {unnamed}: its outbox {box_dir / unnamed} keeps a trained checkpoint ({size:,} bytes) "
            f"and is not removed: the store holds no checkpoint for the run.") in up.stdout
    assert (box_dir / unnamed / "checkpoint" / "model.safetensors").is_file()
    assert not (box_dir / stored).exists()  # the same files and the same weights hash: gone
    assert f"run {stored}: every record is in the store" in up.stdout
    assert (f"run {wrong}: its outbox {box_dir / wrong} keeps a trained checkpoint ({size:,} bytes) and is not "
            f"removed: the run records weights 0000000000000000…, the folder's are {right[:16]}…") in up.stdout
    assert (box_dir / wrong / "checkpoint" / "model.safetensors").is_file()



def test_a_reason_ends_with_the_upload_line_wherever_the_weights_wait_and_only_there(mlflow_server, tmp_path,
                                                                                   monkeypatch):
    """The train step's reason for an arm that did not finish (stalled, a rank killed) ends with
    where the weights are and `gradshare upload DIR` where its outbox journal holds the checkpoint
    the store does not have; not where nothing waits, and never twice."""
    from gradshare.train.arm_record import weights_hint

    monkeypatch.setenv(outbox.ENV, str(tmp_path))
    waiting = _ended_with_checkpoint(tmp_path, "hint-waiting", 1.0, "f" * 64, deliver=True)
    box = tmp_path / waiting
    assert weights_hint(waiting, "stalled: arm dense: ...") == (
        f"; the trained weights are kept in {box}: `gradshare upload {box}` delivers them")
    assert weights_hint(waiting, f"... gradshare upload {box} completes the arm") == ""  # said already
    nothing = _ended_with_checkpoint(tmp_path, "hint-none", 1.0, None, deliver=False)  # written, never journaled
    assert weights_hint(nothing, "stalled: arm dense: ...") == ""
    assert weights_hint("", "stalled") == ""  # the second host: no run, no outbox
