"""Each rank's signs of life and progress, in a file the train step watches, so that a rank that
stops or hangs ends the arm within a bound far below the arm's time limit, named.

Every rank keeps `heartbeat.rank<N>.json` in the arm's working directory:

    alive_t      when the rank's process last ran: a thread of its own rewrites the file every
                 EVERY_S seconds, also while the training thread waits in a collective
    update       the last update the rank completed, and `progress_t`, when
    phase        `start-up` (until the first update is done), `updates`, or a phase whose length
                 no update bound fits (`full state`: a save and its upload; `finish`: the
                 replica check, the checkpoint and its upload): there only `alive_t` counts

The train step (`gradshare.train.supervise`) reads the files of its host's ranks every few seconds
(`stalled`). A rank whose `alive_t` is older than `arms.stall_s` is stopped (SIGSTOP, a frozen
host: every thread of it stands still): the arm ends FAILED, "rank N on host H made no progress
for X s (stopped or hung)". Where every rank is alive but none completed an update for
`arms.hang_updates` x `arms.expected_update_s` (the first update also gets
`arms.expected_startup_s`: compiling, capturing), the rank that progressed least is named the
same way. A peer on another host that stops shows here as no progress: its host's own train
step names it. A link that goes silent (`gradshare.hosts.silence`: data waits for the other host,
nothing comes back; or the ranks wait on it and it answers no connection) is the watch's to bound (`arms.link_silence_s`); once it is heard again, the
update bound counts from then.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

EVERY_S = 1.0
BOUNDED = ("start-up", "updates")  # the phases an update bound applies to


def path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"heartbeat.rank{rank}.json"


class Heartbeat:
    """This rank's heartbeat file, rewritten by a daemon thread until `stop`."""

    def __init__(self, workdir: Path, rank: int, every_s: float = EVERY_S):
        self.file, self.every_s = path(workdir, rank), every_s
        self.rank, self.host, self.pid = rank, socket.gethostname(), os.getpid()
        self.update, self.progress_t, self.phase_name = 0, time.time(), "start-up"
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="gradshare-heartbeat", daemon=True)
        self._thread.start()

    def progress(self, update: int) -> None:
        """This rank completed `update`."""
        self.update, self.progress_t, self.phase_name = update, time.time(), "updates"
        self._write()

    def phase(self, name: str) -> None:
        """This rank enters `name` (`full state`, `finish`: no update bound; `updates` again)."""
        self.phase_name, self.progress_t = name, time.time()
        self._write()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._write()

    def _write(self) -> None:
        tmp = self.file.with_suffix(f".{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"rank": self.rank, "host": self.host, "pid": self.pid, "alive_t": time.time(),
                                   "update": self.update, "progress_t": self.progress_t,
                                   "phase": self.phase_name}))
        os.replace(tmp, self.file)


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    pid: int
    alive_t: float
    update: int
    progress_t: float
    phase: str


def read(workdir: Path) -> list[Beat]:
    """Every rank's last heartbeat in `workdir` (a file being replaced is read next time)."""
    out = []
    for f in sorted(Path(workdir).glob("heartbeat.rank*.json")):
        try:
            out.append(Beat(**json.loads(f.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out


def stalled(beats: list[Beat], now: float, stall_s: float, hang_s: float, first_update_s: float,
            heard_t: float = 0.0) -> str | None:
    """The one-line reason where a rank stopped or every rank hung; None while all is well.
    `hang_s`: seconds an update may take; `first_update_s`: the first one (start-up too);
    `heard_t`: when the arm's link was last silent (`hosts.silence`): an update waiting on a link
    that was down counts from the link's return, not from the last update. The last completed
    update is not in the reason: `train.outcome` adds it once, from the run's own record."""
    for b in sorted(beats, key=lambda b: b.alive_t):
        if now - b.alive_t > stall_s:
            return (f"rank {b.rank} on host {b.host} made no progress for {now - b.progress_t:.0f} s (stopped or "
                    f"hung: its process has not run for {now - b.alive_t:.0f} s, arms.stall_s {stall_s:g})")
    if not beats or any(b.phase not in BOUNDED for b in beats):
        return None
    least = min(beats, key=lambda b: (b.update, b.progress_t))
    bound = first_update_s if least.phase == "start-up" else hang_s
    if now - heard_t > bound and all(now - b.progress_t > bound for b in beats):
        return (f"rank {least.rank} on host {least.host} made no progress for {now - least.progress_t:.0f} s "
                f"(stopped or hung: no rank completed an update within {bound:.0f} s, arms.hang_updates x "
                f"arms.expected_update_s)")
    return None
