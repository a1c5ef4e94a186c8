"""The tracking store this process talks to: which one, whether it answers, and the names
that may be put in it.

MLflow is imported inside the functions that use it, here and in every module of this
package: importing it costs seconds, and the processes that only check a name or a path
(the launcher's refusals, the workers' start) should not pay that.
"""
from __future__ import annotations

import base64
import os
import re
import signal
import sys
import threading
import urllib.error
import urllib.request
from urllib.parse import urlparse

from gradshare.contract.errors import Interrupted, StudyError


REQUEST_TIMEOUT_S = 10
"""Seconds one request may take while records are sent from the outbox (MLflow's own client
would wait 120 s and retry for minutes, stalling every update)."""


def unreachable(uri: str | None = None) -> str | None:
    """Why the tracking server does not answer (the connection error), or None where it does:
    any HTTP answer counts (a proxy or an auth app may refuse /health itself); a local store
    always answers."""

    import mlflow

    uri = uri or mlflow.get_tracking_uri()
    if urlparse(uri).scheme not in ("http", "https"):
        return None
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=REQUEST_TIMEOUT_S).read()
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))
    return None


def reachable(uri: str | None = None) -> bool:
    """Whether the tracking server answers (`unreachable` says why not)."""
    return unreachable(uri) is None


DEFAULT_URI = "sqlite:///mlflow.db"


def mlflow_run_keeps_the_steps_end() -> None:
    """Make MLflow's launcher (`mlflow run`, `mlflow.projects.run`) leave a run its step already
    ended as the step ended it. After a step exits non-zero the launcher ends the run FAILED
    unless it is ended already, but its check (`mlflow.projects._maybe_set_run_terminated`,
    MLflow 3.17) hands `RunStatus.is_terminated` the status as a string where it takes the
    enum's int, so it never holds: a refusal's KILLED became FAILED. Here it takes both; for an
    int nothing changes. Called in the launcher's own process (`gradshare study`), not from the
    plugin, which MLflow loads into every process that imports mlflow and which stays light."""
    from mlflow.entities import RunStatus

    if getattr(RunStatus.is_terminated, "takes_strings", False):
        return
    by_int = RunStatus.is_terminated

    def is_terminated(status) -> bool:
        return by_int(RunStatus.from_string(status) if isinstance(status, str) else status)

    is_terminated.takes_strings = True
    RunStatus.is_terminated = staticmethod(is_terminated)


def stop_on_sigterm() -> None:
    """SIGTERM ends a step as Ctrl-C does (`Interrupted`, an exception: its run is ended KILLED
    "interrupted" with the reason and its processes are stopped), instead of killing it with its
    run left RUNNING. Once: a second SIGTERM while the step stops (a user's impatience, a
    launcher passing its own stop on) is said and ignored, so the step's clean-up is never cut
    short half-way (it once ended prepare in a FileNotFoundError)."""
    if threading.current_thread() is not threading.main_thread():
        return
    stopping = []

    def handler(signum, _frame):
        name = signal.Signals(signum).name
        if stopping:
            print(f"[gradshare] {name} again: already stopping, the step ends its run first", file=sys.stderr,
                  flush=True)
            return
        stopping.append(name)
        raise Interrupted(f"stopped by signal {name}")

    signal.signal(signal.SIGTERM, handler)


def check_reachable(uri: str) -> None:
    """A tracking server that does not answer is refused at once, naming it (MLflow's own
    client would retry for minutes first)."""
    if (reason := unreachable(uri)) is not None:
        # SystemExit: one line on stderr, no run anywhere (there is no store to put one in)
        raise SystemExit(f"[gradshare] the tracking server {uri} is unreachable ({reason}): "
                         f"start it (`gradshare server`) or point MLFLOW_TRACKING_URI at one; nothing was done")


STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


def check_study_name(study: str) -> None:
    """A study's name names its experiment and local files (`guard-<study>.log`): letters,
    digits and `._@-` only, so that no name reaches outside the directory it is put in."""
    if not study or not study.strip():
        raise StudyError("the study name is empty: pass -P study=NAME")
    if not STUDY_NAME.fullmatch(study):
        raise StudyError(f"study name {study!r} is not allowed: use 1-128 letters, digits, '.', '_', '@' or "
                         f"'-', starting with a letter or digit (no '/', no '..', no spaces)")


def safe_artifact_path(path: str) -> str:
    """`path` as an artifact path inside a run's artifact directory, or a StudyError: no
    absolute path, no `..` part, no backslash or NUL (a name made from input, a manifest or a
    journal never reaches outside the run, in the store or in a local download)."""
    text = str(path)
    parts = text.split("/")
    if (not text or text.startswith("/") or "\\" in text or "\0" in text or ":" in parts[0]
            or any(p in ("", ".", "..") for p in parts)):
        raise StudyError(f"artifact path {text!r} is not allowed: relative, '/'-separated names only, "
                         f"without '..', '.', empty parts, backslashes or NUL")
    return text


def connect() -> str:
    """Point MLflow at the store (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here), refusing a
    server that does not answer; returns the URI. Reads and writes nothing in it."""
    import mlflow

    os.environ.setdefault("MLFLOW_TRACKING_URI", DEFAULT_URI)
    # MLflow draws a progress bar for every artifact download (each step fetches the plan): off
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    check_reachable(os.environ["MLFLOW_TRACKING_URI"])
    check_credentials(os.environ["MLFLOW_TRACKING_URI"])
    return os.environ["MLFLOW_TRACKING_URI"]


def check_credentials(uri: str) -> None:
    """A server that refuses this environment's credentials (HTTP 401 or 403 to one search, with
    MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN as MLflow's client sends them) is
    refused in one line, before anything is asked of it: MLflow's client would end in a 29-line
    traceback. The credentials themselves are never printed."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    req = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        req.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    try:
        urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S).read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            given = "no credentials" if req.get_header("Authorization") is None else \
                f"the credentials of {'user ' + repr(user) if user else 'MLFLOW_TRACKING_TOKEN'}"
            raise SystemExit(f"[gradshare] the tracking server {uri} refused {given} (HTTP {exc.code}): set "
                             f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an account it knows; "
                             f"nothing was done") from None
    except (OSError, ValueError):
        pass  # unreachable is check_reachable's to say


def client():
    import mlflow

    return mlflow.MlflowClient()


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StudyError) else str(exc)
    return " ".join(text.split())[:4000]
