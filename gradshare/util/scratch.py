"""Each step's temporary files under one folder of its own, removed when the step ends.

    from gradshare.util.scratch import use_scratch
    use_scratch("train")      # first thing in a step's process

Every `tempfile.mkdtemp` / `NamedTemporaryFile` of the process (gradshare's downloads, the
arm's working directory, MLflow's and transformers' own) then lands in
`$TMPDIR/gradshare-<step>-<pid>-<random>/`, which is removed at the process's exit, whether
the step succeeded, failed or was stopped with Ctrl-C or SIGTERM (both end the step through
an exception). Only a SIGKILL leaves it behind, and the next step on this machine sweeps it:
each folder names its owner in `OWNER` (pid, start in clock ticks since boot, boot and pid
namespace), and a folder whose owner is gone is removed before the new one is made. Child
processes (the arm's workers) inherit `TMPDIR` pointing into it. A `TMPDIR` that cannot be
written is refused in one line (Python's `tempfile` would silently fall back to /tmp).
"""
from __future__ import annotations

import atexit
import getpass
import os
import shutil
import sys
import tempfile
from pathlib import Path

from gradshare.contract.errors import StudyError

_ROOT: Path | None = None
PREFIX = "gradshare-"
OWNER = ".gradshare-owner"  # in each scratch folder: who made it, for the sweep


def start_ticks(pid: int) -> str | None:
    """The process's start in clock ticks since boot (/proc/<pid>/stat, field 22); None where
    there is no such process. With the pid it names one process, however pids are reused, and
    unlike a wall-clock start it does not move when the clock is stepped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def _machine() -> str:
    """This boot and pid namespace: where a pid means one process (a container sharing /tmp has
    pids of its own)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot} {os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def owner_text(pid: int) -> str:
    return f"{pid} {start_ticks(pid) or ''} {_machine()}"


def owner_gone(folder: Path) -> bool:
    """Whether the process that made the scratch `folder` is gone: its pid names no process, or
    another one started since. A folder without an owner file, or made in another boot or pid
    namespace, is never taken for gone (its owner cannot be read from here)."""
    try:
        pid, ticks, boot, ns = (folder / OWNER).read_text().split()
    except (OSError, ValueError):
        return False
    here = _machine().split()
    if len(here) != 2:
        return False
    if (boot, ns) != tuple(here):
        # another boot (or a TMPDIR shared with another machine) or pid namespace: its pid says
        # nothing here, and a folder in use must never be taken
        return False
    return start_ticks(int(pid)) != ticks


def sweep(base: str | Path, log=None) -> list[Path]:
    """Remove the scratch folders under `base` whose owner is gone (a step killed with SIGKILL);
    returns them. Another user's folders, or ones that cannot be removed, are left as they are."""
    removed = []
    try:
        folders = [d for d in Path(base).iterdir() if d.name.startswith(PREFIX) and d.is_dir()]
    except OSError:
        return removed
    for d in folders:
        if owner_gone(d):
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                removed.append(d)
                if log is not None:
                    log(f"[gradshare] removed the scratch folder of a step that was killed: {d} ({size:,} bytes)")
    return removed


def writable_tmpdir() -> str:
    """The base of the scratch folders: `$TMPDIR` where set; a StudyError, in one line, where it
    cannot be written (Python's `tempfile` would otherwise use /tmp without a word)."""
    want = os.environ.get("TMPDIR")
    if want:
        try:
            probe = tempfile.mkdtemp(prefix=".gradshare-write-check-", dir=want)
            os.rmdir(probe)
        except OSError as exc:
            raise StudyError(f"TMPDIR={want} cannot be written ({exc.strerror or exc}): every step keeps its "
                             f"temporary files there; make it writable, point TMPDIR at a folder that is, or "
                             f"unset it; nothing was done") from None
    return tempfile.gettempdir()


def use_scratch(step: str) -> Path:
    """Make this process's scratch folder the temporary directory of everything it starts; first
    remove the folders of steps that were killed (`sweep`). A StudyError where TMPDIR cannot be
    written."""
    global _ROOT
    if _ROOT is not None:
        return _ROOT
    base = writable_tmpdir()
    sweep(base, log=lambda line: print(line, file=sys.stderr, flush=True))
    # torch's compile cache stays where it was (shared by every arm and study), not in the scratch
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(base, f"torchinductor_{getpass.getuser()}"))
    _ROOT = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{step}-{os.getpid()}-", dir=base))
    (_ROOT / OWNER).write_text(owner_text(os.getpid()))
    tempfile.tempdir = str(_ROOT)
    os.environ["TMPDIR"] = str(_ROOT)  # the workers and any library that reads it
    atexit.register(_remove, _ROOT, os.getpid())
    return _ROOT


def _remove(root: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that inherited the handler
        shutil.rmtree(root, ignore_errors=True)
