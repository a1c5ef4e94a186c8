"""An arm's records on local disk until the tracking server has them: nothing is lost when
the server goes away in the middle of an arm.

Everything an arm records (each update's metrics, parameters, tags, full states, the
summary and checkpoint, the run's end) goes through an `Outbox`. A record is appended to
the run's journal first (`<outbox>/<run id>/journal.jsonl`, one JSON line each, flushed
to disk), then sent. While the server does not answer, records wait in the journal and
training goes on; when it answers again they are sent in order, with the times they were
made. A server gone longer than the plan's `arms.tracking_grace_s` ends the arm after a
whole update (`ServerLost`): the journal then holds everything, files copied beside it,
and a documented command delivers it later:

    gradshare upload                          # every journal under ./gradshare-outbox
    gradshare upload gradshare-outbox/<run id> [--tracking-uri http://host:5000]

The outbox directory is `$GRADSHARE_OUTBOX`, else `gradshare-outbox` in the working
directory. A record is sent at most once: `delivered` counts the journal lines the server
has, and moves only after the server said yes. One process sends at a time (a file lock
beside the journal), whichever holds the run: the arm's sending process, its rank 0 at the
end, the driver, `gradshare upload`.

While an arm trains, its rank 0 only appends to the journal; a process of its own
(`gradshare.tracking.sender`) sends, several updates' metrics in one request. Sending from a
thread of the training process took the interpreter from the loop that launches the GPU's
work: each request's client and store code ran between the loop's kernel launches.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from gradshare.contract.tags import FAILURE
from gradshare.tracking.connection import (
    REQUEST_TIMEOUT_S,
    reachable,
    safe_artifact_path,
)


ENV = "GRADSHARE_OUTBOX"
JOURNAL, DELIVERED, LOST_SINCE = "journal.jsonl", "delivered", "lost_since"
SENDER_MODULE = f"{__package__}.sender"  # the sending process (named from this package's own)
SEND_LOCK = ".send.lock"  # held by the one process that sends, for one request at a time
SENDER_ERROR = "sender_error"  # the sending process's reason to stop: a real error of the store
RETRY_EVERY_S = 5.0
"""While the server is lost, how often sending is tried again (not at every update)."""
MAX_METRICS_PER_REQUEST = 1000
"""MLflow's limit of metrics in one `log_batch`: consecutive metrics records are sent together
up to it."""


class ServerLost(RuntimeError):
    """The tracking server stayed unreachable past the grace time; the journal holds everything."""


class SendingStopped(ServerLost):
    """The sending process stopped (the store answered with a real error, or the process died);
    the journal holds everything."""


def root() -> Path:
    return Path(os.environ.get(ENV) or "gradshare-outbox").resolve()


@contextlib.contextmanager
def fast_fail():
    """MLflow client requests that fail at once instead of retrying for minutes (read by MLflow
    at every request); a failure is then told apart by asking the server's /health."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Outbox:
    """The journal of one run, and its delivery. One process at a time appends to it (the arm's
    rank 0 while it trains, then its driver); the journal and its counters live in files, so
    each process sees what the others left. With `background`, a process of its own sends
    while the caller goes on (`gradshare.tracking.sender`): a server that hangs or is gone never
    stalls an update, and no request runs in the caller's interpreter."""

    def __init__(self, run_id: str, grace_s: float, directory: Path | None = None, log=None,
                 background: bool = False):
        self.run_id, self.grace_s = run_id, grace_s
        self.dir = (directory or root()) / run_id
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._next_try = 0.0
        self._journal_lock, self._send_lock = threading.Lock(), threading.Lock()
        self._records: list[dict] = []
        self._read_bytes = 0  # of the journal, whole lines only
        self._reload()
        self._hold = False  # the store refused a record (`keep`): what follows waits for an upload
        self._sender: subprocess.Popen | None = None
        if background:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / SENDER_ERROR).unlink(missing_ok=True)
            self._sender = subprocess.Popen(
                [sys.executable, "-m", SENDER_MODULE, str(self.dir), str(os.getpid()), str(grace_s)],
                stdin=subprocess.DEVNULL)
            atexit.register(self.close)  # an arm that fails leaves no sender behind

    # -- what the arm records -------------------------------------------------------------
    def metrics(self, values: dict, step: int = 0, time_ms: int | None = None) -> None:
        self._add({"kind": "metrics", "values": {k: float(v) for k, v in values.items()}, "step": step,
                   "time_ms": time_ms or int(time.time() * 1000)})

    def params(self, values: dict) -> None:
        self._add({"kind": "params", "values": {k: str(v) for k, v in values.items()}})

    def tags(self, values: dict) -> None:
        self._add({"kind": "tags", "values": {k: str(v) for k, v in values.items()}})

    def text(self, text: str, artifact_file: str) -> None:
        self._add({"kind": "text", "text": text, "artifact_file": safe_artifact_path(artifact_file)})

    def artifacts(self, local: str | Path, artifact_path: str | None = None) -> None:
        """A file or directory. Sent from where it is when nothing waits before it; otherwise
        copied beside the journal first (the arm's working directory does not outlive it)."""

        local = Path(local)
        if artifact_path is not None:
            safe_artifact_path(artifact_path)
        rec = {"kind": "artifacts", "local": str(local), "artifact_path": artifact_path}
        # Nothing else is sent meanwhile. A metrics request of the sending process takes
        # milliseconds; one to a server that hangs is not waited for (a copy waits instead).
        with self._send_lock, self._sending(patience_s=2.0) as mine:
            if mine and not self.pending():
                try:
                    self._send(rec)
                    self._append(rec, delivered=True)
                    return
                except Exception as exc:  # noqa: BLE001 - a lost server: kept below; anything else raised
                    self._unless_lost(exc)
            # behind waiting records, or beside a request of the sending process: a copy waits
            self._append(rec | {"local": str(self._copy_beside(local))})
        self._kick()

    def keep(self, local: str | Path, artifact_path: str) -> Exception | None:
        """A file or directory that must survive any fault of the store: journaled first (copied
        beside the journal unless it already lies inside this outbox), then sent. Returns None
        when it is in the store or waits for a lost server; the store's error when a server that
        answers refused it (full, read-only): it then waits here, and so does every record after
        it, until `gradshare upload` (nothing is tried again in this process)."""
        self.journal(local, artifact_path)
        return self.deliver_or_refusal()

    def journal(self, local: str | Path, artifact_path: str) -> None:
        """A file or directory journaled for delivery, not sent now (copied beside the journal
        unless it already lies inside this outbox)."""
        local = Path(local)
        safe_artifact_path(artifact_path)
        if not local.resolve().is_relative_to(self.dir.resolve()):
            local = self._copy_beside(local)
        self._append({"kind": "artifacts", "local": str(local), "artifact_path": artifact_path})

    def deliver_or_refusal(self) -> Exception | None:
        """Everything that waits, sent now. None when delivered, or waiting for a lost server; the
        store's own error where a server that answers refused a record: it then waits, with
        every record after it, for `gradshare upload` (nothing more is sent from here)."""
        self._hold = False
        try:
            self.deliver(force=True)
        except Exception as exc:  # noqa: BLE001 - the store's own answer: the caller says it
            self.hold()
            return exc
        return None

    def hold(self) -> None:
        """Journal what follows without sending it (records already wait behind one the store
        refused: sending them again would only be refused again)."""
        self._hold = True

    def journaled_tag(self, key: str, value: str) -> bool:
        """Whether the journal holds the tag `key` = `value` (delivered or waiting)."""
        self._reload()
        return any(r["kind"] == "tags" and r["values"].get(key) == value for r in self._records)

    def waiting(self) -> list[dict]:
        """The records that wait for the store, in order (journaled by any process)."""
        self._reload()
        return self._records[self._delivered():]

    def end(self, status: str, tags: dict | None = None) -> None:
        """The run's last record: its tags and its end status (FINISHED, FAILED, KILLED). Where an
        end already waits in the journal (the arm's worker recorded it, and its records wait for
        the store), that end stands: no second one is added."""
        if any(r["kind"] == "end" for r in self._records[self._delivered():]):
            return
        self._add({"kind": "end", "status": status, "tags": {k: str(v) for k, v in (tags or {}).items()},
                   "time_ms": int(time.time() * 1000)})

    def last_step(self, key: str) -> int:
        """The highest step at which `key` was recorded here (0: never)."""
        return max((r["step"] for r in self._records if r["kind"] == "metrics" and key in r["values"]),
                   default=0)

    # -- delivery -----------------------------------------------------------------------------
    def pending(self) -> int:
        return len(self._records) - self._delivered()

    def lost_for(self) -> float:
        """Seconds since the server stopped answering this run's records (0: it answers)."""
        f = self.dir / LOST_SINCE
        try:
            return time.time() - float(f.read_text())
        except (FileNotFoundError, ValueError):
            return 0.0

    def check_grace(self, where: str) -> None:
        """`ServerLost` once the server has been gone longer than the grace time; a real error of
        the store that stopped the sending process, raised here, in the caller."""
        if self._sender is not None:
            error = self.dir / SENDER_ERROR
            if error.exists():
                raise SendingStopped(f"tracking: {error.read_text().strip()}; {self.pending()} records are kept in "
                                   f"{self.dir}: deliver them with `gradshare upload {self.dir}`")
            if self._sender.poll() is not None:
                raise SendingStopped(f"tracking: the outbox's sending process ended with exit code "
                                   f"{self._sender.returncode}; {self.pending()} records are kept in {self.dir}: "
                                   f"deliver them with `gradshare upload {self.dir}`")
        lost = self.lost_for()
        if lost > self.grace_s:
            import mlflow

            raise ServerLost(
                f"tracking: the tracking server {mlflow.get_tracking_uri()} did not answer for {lost:.0f}s "
                f"(arms.tracking_grace_s {self.grace_s:g}), {where}; {self.pending()} records are kept in "
                f"{self.dir}: deliver them with `gradshare upload {self.dir}`")

    def deliver(self, force: bool = False) -> bool:
        """Send every waiting record, in order; True when none waits. While the server is lost
        this tries again only every RETRY_EVERY_S seconds (unless `force`)."""
        self._reload()
        if not self.pending():
            return True
        if not force and time.monotonic() < self._next_try:
            return False
        with self._send_lock:
            done = self._delivered()
            was_lost = self.lost_for() > 0
            while True:
                with self._sending():  # one request at a time, whichever process sends
                    self._reload()
                    i = self._delivered()
                    if i >= len(self._records):
                        break
                    batch = self._batch_from(i)
                    try:
                        self._send_batch(batch)
                    except Exception as exc:  # noqa: BLE001
                        self._unless_lost(exc)
                        return False
                    self._write(DELIVERED, str(i + len(batch)))
            if was_lost:
                self.log(f"[gradshare] the tracking server answers again: {self._delivered() - done} records "
                         f"kept while it was gone are delivered")
            (self.dir / LOST_SINCE).unlink(missing_ok=True)
            return True

    def wait(self, where: str, poll_s: float = 1.0) -> None:
        """Deliver everything, waiting for the server up to the grace time; `ServerLost` after it."""
        self.close()
        while not self.deliver(force=True):
            self.check_grace(where)
            time.sleep(poll_s)

    def close(self, timeout_s: float = 2 * REQUEST_TIMEOUT_S) -> None:
        """Stop the sending process after its current request (what waits stays in the journal,
        for this process or the next to send)."""
        sender, self._sender = self._sender, None
        if sender is None:
            return
        if sender.poll() is None:
            sender.send_signal(signal.SIGTERM)
            try:
                sender.wait(timeout_s)
            except subprocess.TimeoutExpired:
                sender.kill()
                sender.wait()

    # -- inside -------------------------------------------------------------------------------
    def _copy_beside(self, local: Path) -> Path:
        """A copy of `local` (file or directory) beside the journal, for a record that waits."""
        copy = self.dir / "files" / f"{len(self._records):06d}" / local.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if local.is_dir() else shutil.copy2)(local, copy)
        return copy

    def _add(self, rec: dict) -> None:
        self._append(rec)
        self._kick()

    def _kick(self) -> None:
        if self._hold or self._sender is not None:  # the sending process finds the record itself
            return
        self.deliver()

    @contextlib.contextmanager
    def _sending(self, patience_s: float | None = None):
        """This process's turn to send (an exclusive lock on a file beside the journal). With
        `patience_s`, it yields False where another process still holds the turn after that
        long (a request to a server that hangs) instead of waiting for it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / SEND_LOCK, "a") as fh:
            if patience_s is None:
                fcntl.flock(fh, fcntl.LOCK_EX)
            else:
                until = time.monotonic() + patience_s
                while True:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > until:
                            yield False
                            return
                        time.sleep(0.01)
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _reload(self) -> None:
        """The journal's lines that another process appended since this one last read it (whole
        lines only: a line being written is read next time)."""
        with self._journal_lock:
            try:
                with open(self.dir / JOURNAL, "rb") as fh:
                    fh.seek(self._read_bytes)
                    data = fh.read()
            except FileNotFoundError:
                return
            end = data.rfind(b"\n") + 1
            self._records += [json.loads(line) for line in data[:end].decode().splitlines()]
            self._read_bytes += end

    def _batch_from(self, i: int) -> list[dict]:
        """Record i, with the metrics records right after it where it is one: one request for
        several updates' metrics, up to MLflow's limit per request."""
        batch = [self._records[i]]
        if batch[0]["kind"] != "metrics":
            return batch
        count = len(batch[0]["values"])
        for rec in self._records[i + 1:]:
            if rec["kind"] != "metrics" or count + len(rec["values"]) > MAX_METRICS_PER_REQUEST:
                break
            batch.append(rec)
            count += len(rec["values"])
        return batch

    def _send_batch(self, batch: list[dict]) -> None:
        if len(batch) == 1:
            self._send(batch[0])
            return
        import mlflow
        from mlflow.entities import Metric

        with fast_fail():
            mlflow.MlflowClient().log_batch(self.run_id, metrics=[
                Metric(k, v, rec["time_ms"], rec["step"]) for rec in batch for k, v in rec["values"].items()])

    def _unless_lost(self, exc: Exception) -> None:
        """An error from a server that still answers is a real error: raised. A connection that
        failed, or a server that does not answer its health check, is a lost server: the records
        wait, the loss is noted (once) and sending is tried again later."""
        if not _connection_error(exc) and reachable():
            raise exc
        self._next_try = time.monotonic() + RETRY_EVERY_S
        if not (self.dir / LOST_SINCE).exists():
            self._write(LOST_SINCE, f"{time.time():.3f}")
            import mlflow

            self.log(f"[gradshare] the tracking server {mlflow.get_tracking_uri()} does not answer: records "
                     f"wait in {self.dir} (up to arms.tracking_grace_s {self.grace_s:g}s) and are sent when "
                     f"it returns")

    def _send(self, rec: dict) -> None:
        import mlflow
        from mlflow.entities import Metric, Param, RunTag

        c = mlflow.MlflowClient()
        kind = rec["kind"]
        with fast_fail():
            if kind == "metrics":
                c.log_batch(self.run_id, metrics=[Metric(k, v, rec["time_ms"], rec["step"])
                                                  for k, v in rec["values"].items()])
            elif kind == "params":
                c.log_batch(self.run_id, params=[Param(k, v) for k, v in rec["values"].items()])
            elif kind == "tags":
                c.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in rec["values"].items()])
            elif kind == "text":
                c.log_text(self.run_id, rec["text"], rec["artifact_file"])
            elif kind == "artifacts":
                local = Path(rec["local"])
                if local.is_dir():
                    c.log_artifacts(self.run_id, str(local), rec["artifact_path"])
                else:
                    c.log_artifact(self.run_id, str(local), rec["artifact_path"])
            elif kind == "end":
                if rec["status"] == "FINISHED" and FAILURE in c.get_run(self.run_id).data.tags:
                    # an orphan sweep took the waiting run for dead; the arm in fact finished
                    c.delete_tag(self.run_id, FAILURE)
                if rec["tags"]:
                    c.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in rec["tags"].items()])
                c.set_terminated(self.run_id, rec["status"], end_time=rec["time_ms"])
            else:
                raise ValueError(f"{self.dir / JOURNAL}: unknown record kind {kind!r}")

    def _append(self, rec: dict, delivered: bool = False) -> None:
        self._reload()
        line = (json.dumps(rec) + "\n").encode()
        with self._journal_lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / JOURNAL, "ab") as fh:
                fh.write(line)  # one write of a whole line: a reader sees it whole or not at all
                fh.flush()
                os.fsync(fh.fileno())
            self._records.append(rec)
            self._read_bytes += len(line)
            if delivered:
                self._write(DELIVERED, str(len(self._records)))

    def _delivered(self) -> int:
        f = self.dir / DELIVERED
        return int(f.read_text()) if f.exists() else 0

    def _write(self, name: str, text: str) -> None:
        tmp = self.dir / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)


def _connection_error(exc: BaseException) -> bool:
    """A failure to reach the server at all (refused, reset, timed out), however MLflow wrapped it."""

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def upload(paths: list[Path], log=print) -> int:
    """Deliver every journal in `paths` (run directories, or directories of them); returns the
    number of runs still waiting (0: everything delivered)."""
    runs = []
    for p in paths:
        p = Path(p)
        if (p / JOURNAL).exists():
            runs.append(p)
        elif p.is_dir():
            runs += sorted(d for d in p.iterdir() if (d / JOURNAL).exists())
        else:
            raise SystemExit(f"[gradshare] upload: {p} holds no outbox journal ({JOURNAL})")
    waiting = 0
    for d in runs:
        box = Outbox(d.name, grace_s=0, directory=d.parent, log=log)
        before = box.pending()
        if box.deliver(force=True):
            log(f"[gradshare] run {d.name}: {before} records delivered" if before else
                f"[gradshare] run {d.name}: nothing waiting")
        else:
            waiting += 1
            log(f"[gradshare] run {d.name}: {box.pending()} records still waiting (the server does not answer)")
    return waiting
