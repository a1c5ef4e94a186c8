"""Weights are never deleted unless the store holds the same bytes.

An arm's outbox folder (`<outbox>/<run id>/`) may hold the final checkpoint rank 0 wrote there
(`checkpoint/`) before any record names it: a rank killed between the checkpoint and its record
leaves the only copy of the trained weights in a folder whose journal is otherwise delivered.
Every clean-up that removes such a folder (`study_runs.end_run`, `delivered.drop_delivered`)
asks `unstored_weights` first, and keeps the folder where it answers.

The store holds the same bytes where the run's checkpoint artifact lists the same files with the
same sizes, and the run's recorded weights hash (`checkpoint_sha256`, the tag the arm sets from
the checkpoint it wrote) is the folder's own.
"""
from __future__ import annotations

from pathlib import Path

from gradshare.contract.tags import CKPT_SHA
from gradshare.tracking import connection
from gradshare.util.hashing import CheckpointError, checkpoint_sha256, file_entries

CHECKPOINT = "checkpoint"  # gradshare.train.result.CHECKPOINT: the folder in the outbox, and the artifact path


def _stored_files(client, run_id: str, path: str) -> dict[str, int]:
    """Every file of the run's artifact folder `path`, relative to it, with its size."""
    out, todo = {}, [path]
    while todo:
        for a in client.list_artifacts(run_id, todo.pop()):
            if a.is_dir:
                todo.append(a.path)
            else:
                out[a.path[len(path) + 1:]] = a.file_size
    return out


def unstored_weights(run_dir: Path) -> str | None:
    """Why the checkpoint in the run's outbox folder is not (or may not be) in the store: None
    where there is none, or the store holds the same bytes."""
    ckpt = Path(run_dir) / CHECKPOINT
    local = {e["path"]: e["bytes"] for e in file_entries(ckpt)} if ckpt.is_dir() else {}
    if not local:
        return None
    try:
        c = connection.client()
        run = c.get_run(Path(run_dir).name)
        stored = _stored_files(c, run.info.run_id, CHECKPOINT)
    except Exception as exc:  # noqa: BLE001 - unknown is not the same: keep the weights
        return f"the store could not say whether it holds them ({connection.one_line(exc)})"
    if not stored:
        return "the store holds no checkpoint for the run"
    if stored != local:
        differ = sorted(set(stored.items()) ^ set(local.items()))
        return f"the store's checkpoint differs in {len(differ)} file(s), e.g. {differ[0][0]}"
    try:
        sha = checkpoint_sha256(ckpt)
    except CheckpointError:
        sha = None  # not a saved model (no safetensors): its files and sizes are all there is to compare
    recorded = run.data.tags.get(CKPT_SHA)
    if sha is not None and recorded != sha:
        return (f"the run records weights {recorded[:16] + '…' if recorded else 'of no hash'}, the folder's are "
                f"{sha[:16]}…")
    return None


def kept_line(run_dir: Path, why: str) -> str:
    """The one line for a folder kept for its weights."""
    ckpt = Path(run_dir) / CHECKPOINT
    size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    return (f"[gradshare] run {Path(run_dir).name}: its outbox {run_dir} keeps a trained checkpoint "
            f"({size:,} bytes) and is not removed: {why}. These may be the only copy of the weights")
