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
