"""Runs left RUNNING with nobody behind them: found and ended FAILED by the next step.

A run can be left RUNNING by things gradshare never sees: `mlflow run` creating the run
and then failing to find conda, a machine that lost power, a `kill -9`. Every step of a
study first sweeps the study's experiment (`sweep(study)`, called by `tracking.setup`):

  - a run whose step tagged it with its process (`gradshare.pid`, its start in clock ticks
    since boot `gradshare.pid_started`, and `gradshare.host_id`: this network stack, boot
    and pid namespace), and that process is gone (or its pid now belongs to another
    process), is orphaned at once;
  - a run that no gradshare step ever tagged, older than the grace time
    (`GRADSHARE_STALE_GRACE_S`, default 120 s: a launcher's step tags its run within
    seconds; an hour where MLflow may still be building a conda or virtualenv environment),
    is orphaned; one that asked for conda on a machine without it says so;
  - a run whose process lives on another host is left alone: its liveness cannot be
    read from here (that host's next step sweeps it).

An orphaned run ends FAILED with `gradshare.failure_reason` = `orphaned: <what it was>`. A
commit run orphaned after it wrote its `commitment.json` is also tagged
`gradshare.commitment_void=true`, its reason saying the file seals nothing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time

from gradshare.contract.tags import ARM, COMMITMENT_VOID, FAILURE, HOST_ID, PID, PID_STARTED, STEP
from gradshare.hosts.metering import host_identity
from gradshare.tracking import connection
from gradshare.util.scratch import start_ticks  # unlike a wall-clock start, it does not move when the clock is stepped

GRACE_ENV = "GRADSHARE_STALE_GRACE_S"
DEFAULT_GRACE_S = 120.0
COMMITMENT_FILE = "commitment.json"  # what a commit run seals the study with (`steps.commit`)
BUILD_GRACE_S = 3600.0  # a launcher building a conda/virtualenv environment tags its run late


def _scope() -> str:
    """Where a pid means one process: this network stack and boot (metering's host id) and
    this pid namespace (containers sharing a host's network still have pids of their own)."""

    try:
        pid_ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pid_ns = ""
    return hashlib.sha256(f"{host_identity()[0]}\0{pid_ns}".encode()).hexdigest()


def process_tags() -> dict[str, str]:
    """Tags that let a later step tell whether this process still runs."""
    pid = os.getpid()
    return {PID: str(pid), PID_STARTED: start_ticks(pid) or "", HOST_ID: _scope()}


def _alive(tags: dict) -> bool | None:
    """True/False where this host can tell; None where it cannot (other host, untagged)."""
    if PID not in tags or tags.get(HOST_ID) != _scope():
        return None
    try:
        ticks = start_ticks(int(tags[PID]))
    except ValueError:
        return False
    # no such process, or the same pid started at another moment: another process
    return ticks is not None and ticks == tags.get(PID_STARTED)


def _what(run) -> str:
    tags = run.data.tags
    step = tags.get(STEP) or tags.get("mlflow.project.entryPoint") or "unknown step"
    arm = f" of arm {tags[ARM]}" if ARM in tags else ""
    return f"{step} run{arm} {run.info.run_id}"


def _why(run, alive: bool | None) -> str | None:
    """Why the run is orphaned, or None if it is not (or cannot be told)."""
    tags = run.data.tags
    if alive is False:
        return f"its process {tags[PID]} on this host is gone"
    if alive is None and PID not in tags:
        grace = float(os.environ.get(GRACE_ENV, DEFAULT_GRACE_S))
        if tags.get("mlflow.project.env") in ("conda", "virtualenv", "uv") and not (
                tags.get("mlflow.project.env") == "conda" and shutil.which("conda") is None):
            grace = max(grace, BUILD_GRACE_S)  # MLflow may still be building that environment
        age = time.time() - run.info.start_time / 1000
        if age < grace:
            return None
        why = f"no gradshare step ever started in it ({age:.0f}s old)"
        if tags.get("mlflow.project.env") == "conda" and shutil.which("conda") is None:
            why += ("; `mlflow run` asked for conda, which this machine does not have: add "
                    "--env-manager local")
        return why
    return None


def _holds_commitment(run_id: str) -> bool:
    return any(f.path == COMMITMENT_FILE for f in connection.client().list_artifacts(run_id))


def sweep(experiment_id: str, keep: set[str] = frozenset(), log=print) -> list[str]:
    """End the experiment's orphaned RUNNING runs as FAILED; returns their run ids."""
    c = connection.client()
    ended = []
    for run in c.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        if run.info.run_id in keep:
            continue
        why = _why(run, _alive(run.data.tags))
        if why is None:
            continue
        reason = f"orphaned: {_what(run)}; {why}"
        if run.data.tags.get(STEP) == "commit" and _holds_commitment(run.info.run_id):
            # a commit killed after writing its commitment.json: the file stays (nothing is deleted),
            # but it seals nothing; the ledger lets the next commit seal the study
            reason += ("; its commitment.json is void: the commit did not finish, and the study's next "
                       "commit seals it")
            c.set_tag(run.info.run_id, COMMITMENT_VOID, "true")
        c.set_tag(run.info.run_id, FAILURE, reason)
        c.set_terminated(run.info.run_id, "FAILED")
        log(f"[gradshare] ended a stale run FAILED: {reason}")
        ended.append(run.info.run_id)
    return ended
