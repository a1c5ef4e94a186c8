"""Each step's temporary files under one folder of its own, removed when the step ends.

    from gradshare.util.scratch import use_scratch
    use_scratch("train")      # first thing in a step's process

Every `tempfile.mkdtemp` / `NamedTemporaryFile` of the process (gradshare's downloads, the
arm's working directory, MLflow's and transformers' own) then lands in
`$TMPDIR/gradshare-<step>-<pid>-<random>/`, which is removed at the process's exit, whether
the step succeeded, failed or was stopped with Ctrl-C or SIGTERM (both end the step through
an exception). Only a SIGKILL leaves it behind. Child processes (the arm's workers) inherit
`TMPDIR` pointing into it.
"""
from __future__ import annotations

import atexit
import getpass
import os
import shutil
import tempfile
from pathlib import Path

_ROOT: Path | None = None


def use_scratch(step: str) -> Path:
    """Make this process's scratch folder the temporary directory of everything it starts."""
    global _ROOT
    if _ROOT is not None:
        return _ROOT
    base = tempfile.gettempdir()
    # torch's compile cache stays where it was (shared by every arm and study), not in the scratch
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(base, f"torchinductor_{getpass.getuser()}"))
    _ROOT = Path(tempfile.mkdtemp(prefix=f"gradshare-{step}-{os.getpid()}-", dir=base))
    tempfile.tempdir = str(_ROOT)
    os.environ["TMPDIR"] = str(_ROOT)  # the workers and any library that reads it
    atexit.register(_remove, _ROOT, os.getpid())
    return _ROOT


def _remove(root: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that inherited the handler
        shutil.rmtree(root, ignore_errors=True)
