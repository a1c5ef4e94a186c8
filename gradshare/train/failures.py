"""Why an arm's processes failed, in one line: which rank, on which host, the signal or exit
code. The whole chain (each rank's own reason, the launcher's failure summary, every
traceback) is kept for the run's `failure/details.txt` artifact, never put in the reason.

Two sources, both left in the arm's working directory:
  - `failure.rank<N>.txt`: what a rank that caught its own error wrote (`gradshare.train.worker`);
  - `workers.log`: the workers' and the launcher's stderr; on failure it ends with torch
    elastic's summary, one block per failed rank (`rank : 1 (local_rank: 1)`,
    `exitcode : -9 (pid: 123)`, `host : h`), or for one process accelerate's
    `... died with <Signals.SIGKILL: 9>`: the only trace a rank killed by a signal leaves.

A rank killed by a signal is the cause, and the others' errors (a peer that vanished from the
process group) are its consequences; otherwise the first rank's own reason is the cause.
"""
from __future__ import annotations

import re
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from gradshare.train.link_check import LINK_REFUSAL
from gradshare.train.workdir import WORKDIR_CHANGED, WORKERS_LOG

# what a rank writes when Ctrl-C reaches it (`worker.main`): the arm was interrupted, not failed
INTERRUPTED_WORDS = "stopped by the user (interrupt)"
# reasons that already say after which update the arm stopped
SAYS_WHERE = ("deadline:", "budget:", "tracking:")
# reasons the driver passes on as they are: they already say what stopped the arm
OWN_WORDS = SAYS_WHERE + ("the artifact store refused", "replicas disagree", "diverged", "out of device memory",
                          INTERRUPTED_WORDS, WORKDIR_CHANGED, LINK_REFUSAL)


@dataclass(frozen=True)
class RankExit:
    """One failed rank in the launcher's summary."""
    rank: int
    exitcode: int
    host: str

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


_BLOCK = re.compile(r"^\[\d+\]:\s*$", re.M)
_FIELD = re.compile(r"^\s*(host|rank|exitcode)\s*:\s*(\S+)", re.M)


_SIMPLE = re.compile(r"died with <Signals\.(SIG\w+): (\d+)>|returned non-zero exit status (\d+)")


ROOT_CAUSE = "Root Cause (first observed failure):"


def _blocks(text: str) -> list[RankExit]:
    exits = []
    for block in _BLOCK.split(text)[1:]:
        fields = dict(_FIELD.findall(block))
        try:
            exits.append(RankExit(int(fields["rank"]), int(fields["exitcode"]), fields.get("host", "?")))
        except (KeyError, ValueError):
            continue
    return exits


def launcher_exits(log_text: str) -> list[RankExit]:
    """The failed ranks of torch elastic's failure summary (the last one in the log), the first
    observed failure first: the summary lists the other failures before its root cause, and a
    rank that the agent stopped because a peer died (SIGTERM) is one of those. For one process
    (accelerate's simple launcher, no elastic agent) its `CalledProcessError` line, as rank 0 of
    this host."""
    start = log_text.rfind("Failures:")
    if start < 0:
        simple = _SIMPLE.findall(log_text)
        if not simple:
            return []
        _, number, status = simple[-1]
        return [RankExit(0, -int(number) if number else int(status), socket.gethostname())]
    summary = log_text[start:]
    root = summary.find(ROOT_CAUSE)
    if root < 0:
        return _blocks(summary)
    return _blocks(summary[root:]) + _blocks(summary[:root])


def rank_reasons(workdir: Path) -> dict[int, str]:
    """Each rank's own one-line reason (`failure.rank<N>.txt`), by rank."""
    out = {}
    for p in workdir.glob("failure.rank*.txt"):
        m = re.fullmatch(r"failure\.rank(\d+)\.txt", p.name)
        if m:
            out[int(m.group(1))] = p.read_text().strip()
    return dict(sorted(out.items()))


STOPPED_BY_AGENT = ("SIGTERM", "SIGINT", "SIGHUP")  # how torch elastic stops the ranks left when one fails


def one_line(arm: str, rc: int, reasons: dict[int, str], exits: list[RankExit]) -> str:
    """The arm's reason: a rank that a signal killed, else a rank's own reason (one that names
    a study limit or divergence first), else the launcher's exit code. A rank stopped with SIGTERM
    (or SIGINT, SIGHUP) while another rank wrote a reason was stopped by the launcher because of
    it: the reason is the cause (a store that refused the checkpoint, not "killed by SIGTERM")."""
    own = {r.rank for r in exits} & set(reasons)
    killed = [e for e in exits if e.signal_name and e.rank not in own]
    if reasons:  # a rank the agent stopped (SIGTERM) after a peer's own error is its consequence
        killed = [e for e in killed if e.signal_name not in STOPPED_BY_AGENT]
    if killed:
        e = killed[0]
        return (f"arm {arm}: rank {e.rank} on host {e.host} was killed by {e.signal_name} (exit code "
                f"{e.exitcode})")
    for text in reasons.values():
        if text.startswith(OWN_WORDS) or "diverged" in text:
            return text
    if reasons:
        # the first observed failure that wrote a reason (the launcher's summary lists its root
        # cause first), else the lowest rank: a peer's reason is often only the lost connection
        order = [e.rank for e in exits if e.rank in reasons] + sorted(reasons)
        rank = order[0]
        text = reasons[rank]
        host = next((e.host for e in exits if e.rank == rank), None)
        where = f"rank {rank}" + (f" on host {host}" if host else "")
        return f"arm {arm}: {where} failed: {text}"
    if exits:
        e = exits[0]
        return f"arm {arm}: rank {e.rank} on host {e.host} exited with code {e.exitcode} and left no reason"
    return f"arm {arm}: a worker process exited with code {rc} and left no reason"


def details(workdir: Path, reasons: dict[int, str]) -> str:
    """What the `failure/details.txt` artifact holds: each rank's own reason, then the log."""
    parts = [f"rank {r}: {text}" for r, text in reasons.items()] or ["no rank wrote a reason of its own"]
    log = workdir / WORKERS_LOG
    if log.exists():
        parts += ["", f"--- {WORKERS_LOG} (the workers' and the launcher's stderr) ---",
                  log.read_text(errors="replace")]
    return "\n".join(parts) + "\n"


def explain(workdir: Path, arm: str, rc: int) -> tuple[str, str]:
    """(the one-line reason, the details) of a failed launch in `workdir`."""
    reasons = rank_reasons(workdir)
    log = workdir / WORKERS_LOG
    exits = launcher_exits(log.read_text(errors="replace")) if log.exists() else []
    return one_line(arm, rc, reasons, exits), details(workdir, reasons)
