"""An arm's result, recorded by its rank-0 worker the moment the last update is done: the
summary, the schedule's per-update hashes, the final checkpoint and the run's end.

Recorded here, not by the driver that launched the workers, so that a launcher that dies
after training (a `kill -9`, a closed terminal) costs nothing: the arm still ends FINISHED.
The checkpoint is written straight into the run's outbox (`gradshare.tracking.outbox`): the weights
are on local disk before any upload, and stay there until the store has them. Where the
artifact store refuses them (full, read-only, a quota), the arm keeps everything there and
says so in one line; `gradshare upload <outbox>/<run id>` completes it FINISHED later. The
run then shows FAILED with that line until the upload, so nobody takes it for done.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from gradshare.contract import metrics as M
from gradshare.contract.errors import StudyError
from gradshare.contract.tags import CKPT_SHA, FAILURE, SCHEDULE_SHA
from gradshare.hosts import metering
from gradshare.tracking import connection
from gradshare.tracking.orphans import process_tags
from gradshare.tracking.outbox import Outbox
from gradshare.util.hashing import sha256_text

CHECKPOINT = "checkpoint"  # the artifact path, and the folder in the run's outbox


class StoreRefused(StudyError):
    """The artifact store refused the trained checkpoint; the weights wait in the outbox."""


def checkpoint_dir(box: Outbox | None, workdir: Path) -> Path:
    """Where rank 0 writes the final checkpoint: the run's outbox (local disk that outlives the
    arm's working directory), or the working directory when no run records the arm."""
    return (box.dir if box is not None else workdir) / CHECKPOINT


def record(box: Outbox, summary: dict, ckpt: Path, log) -> None:
    """Every record of the finished arm, then its end (FINISHED), through `box`; StoreRefused
    (after the end is journaled) when the artifact store would not take the checkpoint.

    The whole result is journaled first, in one go that SIGTERM and SIGINT wait for, and only
    then sent: a process that dies after that (the launcher's agent stopping rank 0 because a
    peer died after the checkpoint, a kill) leaves the result whole in the journal, and the train
    step delivers it (`complete`). Called again on a journal that holds this result, it only delivers."""
    box.close()  # the updates' records first, in order; nothing is sent behind them meanwhile
    # this result, journaled by an earlier call (a run resumed from a full state keeps its first
    # attempt's journal and its end: the checkpoint's hash says whether this one is in it)
    if not box.journaled_tag(CKPT_SHA, summary["checkpoint_sha256"]):
        with signals_deferred():
            box.hold()  # journal only, until the result is whole
            # this process now stands behind the run: a sweep must not take it for an orphan if
            # the launcher that started the run is gone
            box.tags(process_tags())
            box.metrics(summary["metrics"])
            box.text("\n".join(summary["update_sha256"]) + "\n", "schedule/update_sha256.txt")
            box.tags({SCHEDULE_SHA: sha256_text("\n".join(summary["update_sha256"])),
                      CKPT_SHA: summary["checkpoint_sha256"]})
            box.text(json.dumps({"hosts": summary["hosts"], "losses": summary["losses"]}, indent=2),
                     "train_summary.json")
            box.journal(ckpt, CHECKPOINT)
            box.end("FINISHED")
    if not box.waiting():
        log(f"[gradshare] checkpoint and summary recorded (pid {os.getpid()})")  # by an earlier call
        return
    before, t0 = metering.host_counters(), time.perf_counter()
    refused = box.deliver_or_refusal()
    upload_s = time.perf_counter() - t0
    # The checkpoint's transfer to the artifact store is wire traffic of the arm too (a loopback
    # copy here, 3.4 GB to S3 on the study's hosts): its own line.
    moved = metering.delta(before, metering.host_counters())
    box.metrics({M.wire_tx_bytes("upload"): moved["wire_tx"], M.wire_rx_bytes("upload"): moved["wire_rx"],
                 M.loopback_bytes("upload"): moved["lo_tx"]}
                | ({M.phase_s("checkpoint_upload"): upload_s} if refused is None else {}))
    if refused is not None:
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        reason = (f"the artifact store refused the trained checkpoint ({connection.one_line(refused)}); every update "
                  f"is done and the weights ({size:,} bytes) are kept in {box.dir}: make room in the store, "
                  f"then `gradshare upload {box.dir}` completes the arm FINISHED")
        _show_refused(box.run_id, reason)
        raise StoreRefused(reason)
    box.wait("after the last update")  # the server's last chance within the grace time
    log(f"[gradshare] checkpoint and summary recorded (pid {os.getpid()})")


def complete(box: Outbox, summary: dict, log) -> None:
    """The train step's side: rank 0 trained every update and wrote the checkpoint (its summary
    says so) but died before its result reached the store; the result is recorded from here."""
    record(box, summary, box.dir / CHECKPOINT, log)


def weights_wait(box: Outbox) -> bool:
    """Whether the run's journal holds its checkpoint and the store does not have it yet."""
    return any(r["kind"] == "artifacts" and r["artifact_path"] == CHECKPOINT for r in box.waiting())


@contextlib.contextmanager
def signals_deferred():
    """SIGTERM and SIGINT held until the block ends, then acted on as usual (SIGKILL cannot be).
    Handlers, not a thread's signal mask: the process's other threads (the heartbeat's) would
    take a signal the main thread blocks, and SIGTERM's default ends the whole process."""
    came: list[int] = []
    held = (signal.SIGTERM, signal.SIGINT)
    old = {sig: signal.signal(sig, lambda sig, frame: came.append(sig)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(came):
            os.kill(os.getpid(), sig)  # as it would have been, now


def _show_refused(run_id: str, reason: str) -> None:
    """The run, on the server that still answers, FAILED with the reason until the upload
    (whose journaled end makes it FINISHED and drops the reason)."""
    try:
        c = connection.client()
        c.set_tag(run_id, FAILURE, reason)
        c.set_terminated(run_id, "FAILED")
    except Exception:  # noqa: BLE001 - the journal holds the arm's end either way
        pass
