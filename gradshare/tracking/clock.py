"""This machine's clock against the study's: a step refuses to start on a clock that went back.

The study's deadline and spend (`gradshare.cost.limits`) are differences of wall-clock times:
prepare's start, an arm's start, now. A clock set back between two steps (a restored snapshot,
a hand-set date, `faketime`) makes them lie: an arm that "starts" before prepare, a negative
`spend/study_hours`, a deadline further away than it is. So every step's run first compares
this machine's clock with the latest time the study's store holds (any run's start or end,
the step's own run aside) and, where the clock reads earlier by more than `TOLERANCE_S`, ends
as a refusal (`Refusal`: KILLED, no attempt used) naming the skew.
"""
from __future__ import annotations

import datetime as dt
import time

from gradshare.contract.errors import Refusal
from gradshare.contract.tags import RUN_NAME
from gradshare.tracking import connection

TOLERANCE_S = 60.0
"""How many seconds this machine's clock may read behind the study's last record and still be
trusted. Hosts kept by NTP agree within milliseconds and an unsynchronised one drifts seconds
a day (the two hosts of an arm each stamp their own runs); a clock that was set back reads
minutes or hours behind (the fault seen: 600 s)."""

LOOK_AT = 10
"""Newest runs read per ordering (start, end): the step's own runs are skipped among them, and a
store may sort runs without an end either way."""


def now() -> float:
    """This machine's wall clock, seconds since the epoch (the one the checks read; tests replace it)."""
    return time.time()


def _utc(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def last_record(experiment_id: str, exclude: set[str] = frozenset()) -> tuple[float, str] | None:
    """The latest start or end of a run of the experiment (runs in `exclude` aside), in seconds
    since the epoch, with what it was; None for a study without runs."""
    c = connection.client()
    latest = None
    for attr, what in (("start_time", "start"), ("end_time", "end")):
        for run in c.search_runs([experiment_id], "", order_by=[f"attributes.{attr} DESC"],
                                 max_results=LOOK_AT + len(exclude)):
            ms = getattr(run.info, attr)
            if run.info.run_id in exclude or not ms:
                continue
            name = run.data.tags.get(RUN_NAME, "")
            if latest is None or ms / 1000 > latest[0]:
                latest = (ms / 1000, f"the {what} of run {name} {run.info.run_id}".replace("  ", " "))
    return latest


def check(experiment_id: str, exclude: set[str] = frozenset(), at: float | None = None,
          tolerance_s: float = TOLERANCE_S) -> None:
    """Refuse (`Refusal`) where this machine's clock (`at`, default `now()`) reads more than
    `tolerance_s` before the study's last record."""
    at = now() if at is None else at
    last = last_record(experiment_id, exclude)
    if last is None or at >= last[0] - tolerance_s:
        return
    skew = last[0] - at
    raise Refusal(f"clock: this machine's clock reads {_utc(at)}, {skew:.0f} s before the study's last record "
                  f"({last[1]}, {_utc(last[0])}; {tolerance_s:g} s allowed): the deadline and spend are "
                  f"computed from this clock, so nothing was done. Set the clock right (`timedatectl set-ntp "
                  f"true`, or `chronyc makestep`; unset faketime) and run the step again")
