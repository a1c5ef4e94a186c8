"""A stopped or hung rank is told within a bound (`gradshare.train.heartbeat`): a real process
with a heartbeat, SIGSTOPped, is named once its file is older than `stall_s`, and not before;
ranks that are alive but complete no update are named after the update bound (the first update
after the start-up bound); phases no update bound fits (a full state, the finish) count only
liveness."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from gradshare.train import heartbeat
from gradshare.train.heartbeat import Beat, stalled
from tests.conftest import REPO

RANK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from gradshare.train.heartbeat import Heartbeat
    beat = Heartbeat(Path(sys.argv[1]), int(sys.argv[2]), every_s=0.2)
    beat.progress(3)
    time.sleep(3600)
""")


def test_a_sigstopped_rank_is_named_once_its_heartbeat_is_older_than_the_bound(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path), "1"], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not heartbeat.path(tmp_path, 1).exists() or heartbeat.read(tmp_path)[0].update != 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)
        # running: a beat every 0.2 s; 5 s allowed, for a loaded machine that runs its thread late
        assert stalled(heartbeat.read(tmp_path), time.time(), stall_s=5.0, hang_s=60, first_update_s=60) is None
        os.kill(proc.pid, signal.SIGSTOP)
        t_stop = time.time()
        time.sleep(1.6)
        why = stalled(heartbeat.read(tmp_path), time.time(), stall_s=1.0, hang_s=60, first_update_s=60)
        assert why is not None and why.startswith("rank 1 on host ") and "(stopped or hung" in why
        beat = heartbeat.read(tmp_path)[0]
        assert beat.alive_t <= t_stop + 0.05  # nothing written while it was stopped
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _beat(rank, update, progress_ago, alive_ago=0.0, phase="updates", now=1000.0):
    return Beat(rank, "h", 1, now - alive_ago, update, now - progress_ago, phase)


def test_alive_ranks_that_complete_no_update_are_named_after_the_update_bound():
    now = 1000.0
    fine = [_beat(0, 5, 10), _beat(1, 5, 12)]
    assert stalled(fine, now, stall_s=30, hang_s=20, first_update_s=100) is None
    hung = [_beat(0, 5, 25), _beat(1, 4, 40)]  # rank 1 is behind: it is the one named
    why = stalled(hung, now, stall_s=30, hang_s=20, first_update_s=100)
    assert why.startswith("rank 1 on host h made no progress for 40 s") and "within 20 s" in why
    # the driver adds the last completed update once, from the run's record: the reason once said it twice
    assert "last completed update" not in why
    one_moving = [_beat(0, 5, 25), _beat(1, 5, 5)]
    assert stalled(one_moving, now, stall_s=30, hang_s=20, first_update_s=100) is None
    starting = [_beat(0, 0, 50, phase="start-up"), _beat(1, 0, 50, phase="start-up")]
    assert stalled(starting, now, stall_s=30, hang_s=20, first_update_s=100) is None  # compiling
    assert "within 100 s" in stalled([_beat(0, 0, 101, phase="start-up")], now, 30, 20, 100)


def test_after_a_silent_link_the_update_bound_counts_from_the_links_return():
    now = 1000.0
    waited = [_beat(0, 2, 70), _beat(1, 2, 70)]  # no update for 70 s: the link was down for 60 of them
    assert stalled(waited, now, stall_s=30, hang_s=20, first_update_s=100, heard_t=now - 19) is None
    why = stalled(waited, now, stall_s=30, hang_s=20, first_update_s=100, heard_t=now - 21)
    assert why.startswith("rank 0 on host h made no progress for 70 s") and "within 20 s" in why
    # a rank whose process stopped is named whatever the link did
    frozen = [_beat(0, 2, 70, alive_ago=31), _beat(1, 2, 70)]
    assert stalled(frozen, now, stall_s=30, hang_s=20, first_update_s=100, heard_t=now).startswith("rank 0")


def test_a_save_or_the_finish_counts_only_liveness():
    now = 1000.0
    saving = [_beat(0, 5, 500, phase="full state"), _beat(1, 5, 500)]
    assert stalled(saving, now, stall_s=30, hang_s=20, first_update_s=100) is None
    frozen = [_beat(0, 8, 500, alive_ago=31, phase="finish"), _beat(1, 8, 500, phase="finish")]
    assert stalled(frozen, now, stall_s=30, hang_s=20, first_update_s=100).startswith("rank 0 on host h")


def test_the_arms_watch_asks_the_heartbeat_with_the_plans_own_bounds(tmp_path, monkeypatch):
    """`supervise.watch` passes the stall bound, the hang bound and the first update's bound (start-up
    included) to `heartbeat.stalled`, on fixed figures: a watch that passed another bound (the
    time limit, stall_s twice) is caught here, not only by an e2e hang."""
    import subprocess
    import sys

    from gradshare.contract.plan import load_plan
    from gradshare.train import supervise

    plan = load_plan("tiny", {"arms.stall_s": "12", "arms.hang_updates": "10", "arms.expected_update_s": "3",
                              "arms.expected_startup_s": "50"})
    asked = []
    monkeypatch.setattr(supervise.heartbeat, "stalled", lambda beats, now, *bounds: asked.append(bounds))
    monkeypatch.setattr(supervise, "WATCH_EVERY_S", 0.05)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert supervise.watch(plan, "dense", proc, tmp_path, limit=60) == 0
    # stall_s, 10 x 3 s, 50 s + 30 s; one host: no link to hear from, the update bound counts from the update
    assert asked and set(asked) == {(12.0, 30.0, 80.0, 0.0)}
