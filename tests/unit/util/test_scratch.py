"""Each step's scratch folder: a killed step's is swept by the next step, and a TMPDIR that
cannot be written is refused in one line instead of silently bypassed."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

from gradshare.util import scratch
from tests.conftest import REPO

HOLD = textwrap.dedent("""
    import sys, time
    from gradshare.util.scratch import use_scratch
    root = use_scratch(sys.argv[1])
    (root / "weights.bin").write_bytes(b"\\0" * 5_200_000)  # as big as a killed driver's leftovers
    print(root, flush=True)
    time.sleep(600)
""")


def _step_holding_its_scratch(base, step: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, step], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(base)})
    return proc, proc.stdout.readline().strip()


def test_the_next_step_sweeps_a_killed_steps_scratch_and_keeps_a_live_ones(tmp_path):
    """A driver SIGKILLed leaves its 5.2 MB scratch folder; the next step on the machine removes
    it, saying so in one line, and leaves alone a step that still runs and a folder whose owner
    it cannot read."""
    base = tmp_path / "tmp"
    base.mkdir()
    killed, killed_dir = _step_holding_its_scratch(base, "train")
    alive, alive_dir = _step_holding_its_scratch(base, "score")
    unknown = base / "gradshare-older-123-abc"  # made before owners were recorded: never guessed at
    unknown.mkdir()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert os.path.isdir(killed_dir)  # SIGKILL: no exit handler ran
        nxt = subprocess.run([sys.executable, "-c", "from gradshare.util.scratch import use_scratch; "
                              "print(use_scratch('commit'))"], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "TMPDIR": str(base)}, timeout=120)
        assert nxt.returncode == 0, nxt.stderr
        assert not os.path.exists(killed_dir)
        [line] = nxt.stderr.splitlines()
        assert re.fullmatch(rf"\[gradshare\] removed the scratch folder of a step that was killed: "
                            rf"{re.escape(killed_dir)} \(5,200,\d\d\d bytes\)", line), line
        assert os.path.isdir(alive_dir) and unknown.is_dir()
        assert not os.path.exists(nxt.stdout.strip())  # the commit's own, removed at its exit
    finally:
        alive.kill()
        alive.wait()


def test_a_scratch_folder_whose_pid_now_names_another_process_is_swept(tmp_path):
    """A pid is reused: the owner file's start ticks tell the process that made the folder from
    the one that has its pid now (this test's own process, here)."""
    folder = tmp_path / "gradshare-train-1-x"
    folder.mkdir()
    pid, ticks, boot, ns = scratch.owner_text(os.getpid()).split()
    (folder / scratch.OWNER).write_text(f"{pid} {int(ticks) - 1} {boot} {ns}")  # started earlier: not us
    mine = tmp_path / "gradshare-train-2-y"
    mine.mkdir()
    (mine / scratch.OWNER).write_text(scratch.owner_text(os.getpid()))
    assert scratch.sweep(tmp_path) == [folder]
    assert mine.is_dir()


def _read_only(folder) -> callable:
    """`folder` made read-only for real (a read-only tmpfs as root, else its mode); returns the undo."""
    folder.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], check=True)
        return lambda: subprocess.run(["umount", str(folder)], check=False)
    folder.chmod(0o555)
    return lambda: folder.chmod(0o755)


def test_a_read_only_tmpdir_is_refused_in_one_line_before_any_run(tmp_path):
    """Python's tempfile silently uses /tmp where TMPDIR cannot be written (a big model's files
    would land on the wrong disk). A step refuses, in one line, naming it and what to do."""
    ro = tmp_path / "ro"
    undo = _read_only(ro)
    try:
        proc = subprocess.run([sys.executable, "-m", "entrypoints.commit", "--study", "never-made"], cwd=REPO,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": str(ro), "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    finally:
        undo()
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"[gradshare] TMPDIR={ro} cannot be written (") and "nothing was done" in line, line
    assert "make it writable" in line
