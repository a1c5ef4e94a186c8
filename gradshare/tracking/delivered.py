"""After `gradshare upload`: an ended run's outbox, once the store has every record, is removed.

An arm's outbox (`<outbox>/<run id>/`) holds its journal and the files its records name: copies
under `files/`, and the final checkpoint rank 0 wrote there (`checkpoint/`, the size of the
model). While a record waits they are the only copy; once the store has them all they are
disk taken for nothing. An arm that ends with every record delivered drops its folder itself
(`study_runs.end_run`); one delivered later by `gradshare upload` is dropped here. Only a run
whose journal holds its end is touched: nobody appends to an ended run, so nothing written
meanwhile can be lost. A folder that holds a checkpoint the store does not hold byte for byte
is kept (`gradshare.tracking.weights_guard`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from gradshare.tracking.outbox import JOURNAL, Outbox
from gradshare.tracking.weights_guard import kept_line, unstored_weights


def _ended(run_dir: Path) -> bool:
    """Whether the journal holds the run's end (its last record once the run is over)."""
    try:
        lines = (run_dir / JOURNAL).read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            if json.loads(line).get("kind") == "end":
                return True
        except ValueError:
            continue  # a line cut by a crash: not an end
    return False


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def drop_delivered(paths: list[Path], log=print) -> list[Path]:
    """Remove each ended run's outbox folder under `paths` (run folders, or folders of them) whose
    records the store all has; returns the folders removed."""
    runs = []
    for p in map(Path, paths):
        if (p / JOURNAL).exists():
            runs.append(p)
        elif p.is_dir():
            runs += sorted(d for d in p.iterdir() if (d / JOURNAL).exists())
    removed = []
    for d in runs:
        if Outbox(d.name, grace_s=0, directory=d.parent, log=lambda _: None).pending() or not _ended(d):
            continue
        if (why := unstored_weights(d)) is not None:
            log(kept_line(d, why))
            continue
        size = _bytes(d)
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
            log(f"[gradshare] run {d.name}: every record is in the store; its outbox {d} is removed "
                f"({size:,} bytes)")
    return removed
