"""Runs left RUNNING with nobody behind them: found and ended FAILED by the next step.

A run can be left RUNNING by things gradshare never sees: `mlflow run` creating the run
and then failing to find conda, a machine that lost power, a `kill -9`. Every step of a
study first sweeps the study's experiment (`sweep(study)`, called by `tracking.setup`):

  - a run whose step tagged it with its process (`gradshare.pid`, `gradshare.pid_started`,
    `gradshare.host_id`) on this host, and that process is gone (or its pid now belongs to
    another process), is orphaned at once;
  - a run that no gradshare step ever tagged, older than the grace time
    (`GRADSHARE_STALE_GRACE_S`, default 120 s: a launcher's step tags its run within
    seconds), is orphaned; one that asked for conda on a machine without it says so;
  - a run whose process lives on another host is left alone: its liveness cannot be
    read from here (that host's next step sweeps it).

An orphaned run ends FAILED with `gradshare.failure_reason` = `orphaned: <what it was>`.
"""
from __future__ import annotations

import os
import shutil
import time

PID, PID_STARTED, HOST_ID = "gradshare.pid", "gradshare.pid_started", "gradshare.host_id"
GRACE_ENV = "GRADSHARE_STALE_GRACE_S"
DEFAULT_GRACE_S = 120.0


def process_tags() -> dict[str, str]:
    """Tags that let a later step tell whether this process still runs."""
    import psutil

    from gradshare.metering import host_identity

    me = psutil.Process()
    return {PID: str(me.pid), PID_STARTED: f"{me.create_time():.3f}", HOST_ID: host_identity()[0]}


def _alive(tags: dict) -> bool | None:
    """True/False where this host can tell; None where it cannot (other host, untagged)."""
    import psutil

    from gradshare.metering import host_identity

    if PID not in tags or tags.get(HOST_ID) != host_identity()[0]:
        return None
    try:
        p = psutil.Process(int(tags[PID]))
        # the same pid, started at another time, is another process
        return abs(p.create_time() - float(tags.get(PID_STARTED, "0"))) < 0.01
    except (psutil.NoSuchProcess, ValueError):
        return False


def _what(run) -> str:
    tags = run.data.tags
    from gradshare import tracking as T

    step = tags.get(T.STEP) or tags.get("mlflow.project.entryPoint") or "unknown step"
    arm = f" of arm {tags[T.ARM]}" if T.ARM in tags else ""
    return f"{step} run{arm} {run.info.run_id}"


def _why(run, alive: bool | None) -> str | None:
    """Why the run is orphaned, or None if it is not (or cannot be told)."""
    tags = run.data.tags
    if alive is False:
        return f"its process {tags[PID]} on this host is gone"
    if alive is None and PID not in tags:
        grace = float(os.environ.get(GRACE_ENV, DEFAULT_GRACE_S))
        age = time.time() - run.info.start_time / 1000
        if age < grace:
            return None
        why = f"no gradshare step ever started in it ({age:.0f}s old)"
        if tags.get("mlflow.project.env") == "conda" and shutil.which("conda") is None:
            why += ("; `mlflow run` asked for conda, which this machine does not have: add "
                    "--env-manager local")
        return why
    return None


def sweep(experiment_id: str, keep: set[str] = frozenset(), log=print) -> list[str]:
    """End the experiment's orphaned RUNNING runs as FAILED; returns their run ids."""
    from gradshare import tracking as T

    c = T.client()
    ended = []
    for run in c.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        if run.info.run_id in keep:
            continue
        why = _why(run, _alive(run.data.tags))
        if why is None:
            continue
        reason = f"orphaned: {_what(run)}; {why}"
        c.set_tag(run.info.run_id, T.FAILURE, reason)
        c.set_terminated(run.info.run_id, "FAILED")
        log(f"[gradshare] ended a stale run FAILED: {reason}")
        ended.append(run.info.run_id)
    return ended
