"""Supervision of an arm's processes on this host: the launcher and the workers it started
watched until they end (each rank's heartbeat, the link to a peer host, the arm's time limit),
stopped as a tree when they must be, and gradshare's own lines of their log followed to the
console. What their end means for the arm is `train.outcome`'s to say.
"""
from __future__ import annotations

import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from gradshare.contract.errors import StudyError
from gradshare.contract.plan import Plan
from gradshare.hosts import silence
from gradshare.train import heartbeat
from gradshare.train.launch import Launch


# Seconds between asking the arm's processes to stop (SIGTERM) and killing them.
STOP_GRACE_S = 10


def stop_tree(pid: int, grace_s: float = STOP_GRACE_S) -> None:
    """End a process and every descendant: SIGTERM, then SIGKILL after `grace_s`.

    The descendants are listed before anything is signalled: torch's elastic launcher
    starts each rank in a session of its own, so a process-group kill would miss them, and
    a rank whose launcher has died is re-parented away from this tree.
    """

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


WATCH_EVERY_S = 2.0  # how often the launcher, the orphans, the heartbeats and the link are looked at
# A peer host unheard for this long while data waits for it counts as silent (`hosts.silence`): a
# flowing exchange is acknowledged within milliseconds, a slow one within a round trip.
SILENT_AFTER_S = 3.0
# After a silence of L seconds the peer's own data may wait up to about L more: TCP doubles the
# wait between retransmissions, so the one after the link's return comes up to the silence's
# length later (before the 120-s cap). This host hears its peer again while the peer's data still
# waits there, so the update bound counts from the return plus this many times the silence.
# (A 30-s partition under load once ended a two-host arm "stalled": 69 s without progress, so at
# most 39 s after the return, under the 30-s update bound counted from it.)
BACKOFF_AFTER_SILENCE = 1.0
# A host whose ranks only wait to receive asks its peer (`silence.unanswered`) once no rank has
# progressed for this share of the update bound, and at every look after. Asked only at the bound
# itself, a link down about as long as the bound is back by then: the peer answers, its data still
# waits in TCP's backoff, and the ranks are named hung (a 30-s partition under the 30-s bound, in
# CI). Asked from a third, a silence goes unnoticed only where it ended before a third of the bound
# (plus a look), and the data it held comes by twice that: inside the bound. An update as slow as a
# third of the bound (3.3 expected updates) is rare, so the peer is seldom asked while all is well.
ASK_PEER_AT = 1 / 3


def peer_name(launch: Launch) -> str:
    """The other host of a two-host arm, as the README numbers them (by machine rank)."""
    return f"host {1 - launch.machine_rank}" if launch.num_machines == 2 else "another host"


def watch(plan: Plan, arm: str, proc: subprocess.Popen, workdir: Path, limit: float,
          launch: Launch = Launch()) -> int:
    """The launcher's exit code, once it and every worker it started have ended. Meanwhile each
    rank's heartbeat (`heartbeat.stalled`): a rank stopped or hung ends the arm within
    `arms.stall_s` / `arms.hang_updates` x `arms.expected_update_s`, named; the arm's time limit
    stays the outer bound. A launcher killed mid-arm leaves its workers running: they are
    watched the same way until they end, and the arm completes (README, "Faults"). Across hosts,
    the link too (`hosts.silence`): a peer host silent past `arms.link_silence_s` ends the arm,
    "no traffic from host N"; one heard again sooner lets it go on, the update bound counting
    from the link's return plus the silence's length (`BACKOFF_AFTER_SILENCE`)."""
    a = plan.arms
    deadline = time.monotonic() + limit
    rc, heard_t, silent_since, silent_from = None, 0.0, None, 0.0
    while True:
        if rc is None:
            try:
                rc = proc.wait(timeout=WATCH_EVERY_S)
                if rc != 0 and (left := workers(workdir, proc.pid)):
                    print(f"[gradshare] arm {arm}: the launcher ended with code {rc} while {len(left)} worker(s) "
                          f"run on: they are watched until they end", file=sys.stderr, flush=True)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(WATCH_EVERY_S)
        running = workers(workdir, proc.pid)
        if rc is not None and not running:
            return rc
        now = time.time()
        beats = heartbeat.read(workdir)

        def hung(heard: float, share: float = 1.0) -> str | None:
            return heartbeat.stalled(beats, now, a.stall_s, share * a.hang_s(),
                                     share * (a.expected_startup_s + a.hang_s()), heard)

        if launch.num_machines > 1:
            pids = {p.pid for p in running}
            quiet = silence.read(pids)
            if (quiet is None or quiet.seconds < SILENT_AFTER_S) and (
                    silent_since is not None or hung(heard_t, ASK_PEER_AT)):
                # this host's ranks may only wait to receive: nothing of theirs is left unacknowledged,
                # so a downed link shows only as a peer that answers no connection (asked only here:
                # while a silence lasts, or once the ranks made no progress for a share of the bound)
                quiet = silence.unanswered(pids) or quiet
            if quiet is not None and quiet.seconds >= SILENT_AFTER_S:
                if silent_since is None:
                    # a silence inside the last one's allowance (heard again briefly) is the same outage
                    start = now - quiet.seconds
                    silent_since, silent_from = quiet, (start if now > heard_t else min(silent_from, start))
                    print(f"[gradshare] arm {arm}: no traffic from {peer_name(launch)} ({quiet.addr}) for "
                          f"{quiet.seconds:.0f} s while {quiet.waiting}: the arm waits up to arms.link_silence_s "
                          f"{a.link_silence_s:g} s for the link", file=sys.stderr, flush=True)
                heard_t = now
                if quiet.seconds > a.link_silence_s:
                    stop_all(proc, workdir)
                    raise StudyError(  # whole seconds rounded up: past a bound of 15 s reads 16, never 15
                        f"no traffic: arm {arm}: no traffic from {peer_name(launch)} ({quiet.addr}) for "
                        f"{math.ceil(quiet.seconds)} s while this host's ranks wait on it (arms.link_silence_s "
                        f"{a.link_silence_s:g}): the link is down or partitioned; every process of the arm "
                        f"on this host was stopped")
            elif silent_since is not None:
                print(f"[gradshare] arm {arm}: {peer_name(launch)} ({silent_since.addr}) is heard again: the arm "
                      f"goes on", file=sys.stderr, flush=True)
                heard_t = now + BACKOFF_AFTER_SILENCE * (now - silent_from)
                silent_since = None
        why = hung(heard_t)
        if why:
            stop_all(proc, workdir)
            raise StudyError(f"stalled: arm {arm}: {why}; every process of the arm was stopped")
        if time.monotonic() > deadline:
            stop_all(proc, workdir)
            raise StudyError(
                f"timeout: arm {arm} did not finish within {limit:.0f}s (arms.startup_s {a.startup_s:g} + "
                f"{plan.schedule.updates} updates x arms.expected_update_s {a.expected_update_s:g} x "
                f"arms.timeout_margin {a.timeout_margin:g}); every rank was stopped. The hardware is slower "
                f"than planned: raise arms.expected_update_s at prepare")


def workers(workdir: Path, launcher_pid: int) -> list[psutil.Process]:
    """The arm's worker processes on this host: every process started with this working
    directory but the launcher (whose own command line names it too)."""
    mark = f"--workdir {workdir}"
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != launcher_pid and mark in " ".join(p.info["cmdline"] or []) and \
                    p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def stop_all(proc: subprocess.Popen, workdir: Path) -> None:
    """The launcher and its tree, then any worker that outlived it."""
    if proc.poll() is None:
        stop_tree(proc.pid)
    for p in workers(workdir, proc.pid):
        stop_tree(p.pid)


class Follower:
    """Copies gradshare's own lines (`[gradshare] ...`) from the workers' log to this process's
    stderr as they come; the rest stays in the log (and the run's `log/workers.txt`)."""

    def __init__(self, path: Path, every_s: float = 0.5):
        self.path, self.every_s, self.pos = path, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gradshare-log", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        with open(self.path, "rb") as fh:
            fh.seek(self.pos)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # whole lines only
        self.pos += end
        for line in data[:end].decode(errors="replace").splitlines():
            if "[gradshare]" in line:
                print(line, file=sys.stderr, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._copy()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._copy()
