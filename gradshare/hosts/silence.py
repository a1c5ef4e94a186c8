"""How long another host has been silent to this host's ranks: a partitioned link, told apart
from a hung rank by what the kernel knows of the ranks' TCP connections.

    from gradshare.hosts import silence
    quiet = silence.read({worker.pid for worker in workers})   # None: nobody is silent
    if quiet and quiet.seconds > plan.arms.link_silence_s: ...   # "no traffic from host 1 (addr) ..."

A peer host is *silent* when one of the ranks' connections to it holds data the peer has not
acknowledged (the send queue is not empty), and nothing at all came from it, on any connection
of the ranks, for `seconds` (the kernel's `lastrcv` and `lastack`, read with `ss -tinp`). That is
what a link taken down or partitioned looks like: the data waits, every retransmission goes
unanswered. A rank that hangs does not look like that: its kernel still acknowledges what its
peer sent (the queue drains, or a full window is answered with ACKs), so a hang stays the
heartbeat's to name (`train.heartbeat`), and a slow link (acknowledgements arrive, late) is not
silence either.

A host whose ranks only wait to *receive* from the peer has nothing unacknowledged: the link's
silence cannot show in its own queues. There `unanswered` asks the peer's kernel instead: a new
connection to a port the ranks already talk to it on, answered (accepted or refused) within a second
by a peer that is there, never by one behind a downed link. The watch asks it only once its ranks
made no progress for a share of the update bound (`train.supervise.ASK_PEER_AT`), so a hung peer
rank, which still answers, stays the heartbeat's.

Loopback connections (the tracking server, the bridge of the emulated hosts) never count. Where
`ss` (iproute2) is missing or fails, nothing is known: `read` returns None and only the heartbeat's
bounds apply.
"""
from __future__ import annotations

import ipaddress
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Connection:
    """One established TCP connection of the ranks, as `ss -tinp` shows it."""
    local: str
    peer: str  # the peer's address (no port)
    send_q: int  # bytes sent and not yet acknowledged, or not yet sent
    last_heard_ms: int  # since the last data or ACK from the peer
    window_closed: bool  # the peer advertised a zero window: it answers, its reader does not read
    pids: frozenset[int]
    peer_port: int = 0


@dataclass(frozen=True)
class Silence:
    """The peer host silent the longest, and for how long; `waiting`: what shows it (data of this
    host's ranks waits for it, or their peer answers no connection)."""
    addr: str
    seconds: float
    waiting: str = "data waits for it"


_ADDR_PORT = re.compile(r"^\[?(?P<addr>.*?)\]?:(?P<port>\d+|\*)$")
_FIELD = re.compile(r"\b(lastrcv|lastack|snd_wnd):(\d+)")
_PID = re.compile(r"pid=(\d+)")


def _addr(text: str) -> str:
    m = _ADDR_PORT.match(text)
    addr = m.group("addr") if m else text
    return addr.split("%", 1)[0].removeprefix("::ffff:")  # a v4 peer of a v6 socket, a scope id


def _port(text: str) -> int:
    m = _ADDR_PORT.match(text)
    return int(m.group("port")) if m and m.group("port").isdigit() else 0


def kernel_reports_window(release: str | None = None) -> bool:
    """Whether this kernel (`uname -r`) puts the peer's window in `tcp_info` (Linux 6.2 and later)."""
    m = re.match(r"(\d+)\.(\d+)", release if release is not None else platform.release())
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (6, 2)


def parse(text: str, window_reported: bool | None = None) -> list[Connection]:
    """`ss -tinpH state established`'s output as connections. Each connection is a line
    `Recv-Q Send-Q local peer [users:((...,pid=N,...))]` followed by an indented line of
    `tcp_info` fields (`lastrcv:MS lastack:MS snd_wnd:BYTES ...`, each left out where it is 0). On kernels before 6.2, which do
    not report the peer's window, a peer that stops reading may look silent between the answers
    to the kernel's window probes (at most 120 s apart)."""
    out: list[Connection] = []
    head: list[str] | None = None
    # `ss` prints `snd_wnd` only where it is not 0, and only on kernels that report it (6.2+): there,
    # a connection without one has a closed window
    reports_window = ("snd_wnd:" in text or kernel_reports_window()) if window_reported is None else window_reported
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            head = line.split()
            continue
        if head is None or len(head) < 4:
            continue
        try:
            send_q = int(head[1])
        except ValueError:
            head = None
            continue
        fields = {k: int(v) for k, v in _FIELD.findall(line)}
        # `ss` leaves out a `last...` field that is 0: heard this very millisecond
        heard = min(fields.get("lastrcv", 0), fields.get("lastack", 0))
        out.append(Connection(local=_addr(head[2]), peer=_addr(head[3]), send_q=send_q,
                              last_heard_ms=heard, window_closed=reports_window and not fields.get("snd_wnd"),
                              pids=frozenset(int(p) for p in _PID.findall(" ".join(head[4:]))),
                              peer_port=_port(head[3])))
        head = None
    return out


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _by_peer(connections: list[Connection], pids: set[int]) -> dict[str, list[Connection]]:
    by_peer: dict[str, list[Connection]] = {}
    for c in connections:
        if c.pids & pids and not _loopback(c.peer):
            by_peer.setdefault(c.peer, []).append(c)
    return by_peer


def silent_peer(connections: list[Connection], pids: set[int]) -> Silence | None:
    """The peer host silent the longest to the processes `pids` (see the module's docstring);
    None where every peer with something pending has been heard from, or none has anything pending."""
    worst: Silence | None = None
    for peer, conns in _by_peer(connections, pids).items():
        if not any(c.send_q > 0 and not c.window_closed for c in conns):
            continue  # nothing waits on this peer: an idle link is not a silent one
        seconds = min(c.last_heard_ms for c in conns) / 1000
        if worst is None or seconds > worst.seconds:
            worst = Silence(peer, seconds)
    return worst


ANSWER_TIMEOUT_S = 1.0  # a peer that is there answers a connection within a round trip or two
PORTS_TRIED = 3  # per peer: one answer is enough, a few tries cover a port closed just then


def answers(addr: str, ports: list[int], timeout_s: float = ANSWER_TIMEOUT_S) -> bool:
    """Whether the host `addr` answers a new TCP connection to one of `ports` within `timeout_s`:
    accepted (closed again at once, before a byte is sent: gloo's listener drops a connection that
    names no pair) or refused; a timeout, or no route to it, is no answer."""
    for port in ports[:PORTS_TRIED]:
        try:
            socket.create_connection((addr, port), timeout=timeout_s).close()
            return True
        except (ConnectionRefusedError, ConnectionResetError):
            return True
        except OSError:  # timed out; the network or the host unreachable
            continue
    return False


def unanswered_peer(connections: list[Connection], pids: set[int],
                    answer: Callable[[str, list[int]], bool] = answers) -> Silence | None:
    """The peer host of the processes `pids` that nothing of theirs waits on and that does not
    `answer` a connection to the ports they talk to it on; `seconds`: since anything came from it
    (the longest, where several are). None where every such peer answers."""
    worst: Silence | None = None
    for peer, conns in _by_peer(connections, pids).items():
        if any(c.send_q > 0 for c in conns):
            continue  # data waits on this peer: `silent_peer` reads it from the queues
        ports = sorted({c.peer_port for c in conns if c.peer_port})
        if not ports or answer(peer, ports):
            continue
        seconds = min(c.last_heard_ms for c in conns) / 1000
        if worst is None or seconds > worst.seconds:
            worst = Silence(peer, seconds, "this host's ranks wait for it and it answers no connection")
    return worst


def _established() -> list[Connection] | None:
    """This network namespace's established TCP connections (`ss`); None where `ss` cannot tell."""
    if shutil.which("ss") is None:
        return None
    try:
        proc = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse(proc.stdout) if proc.returncode == 0 else None


def read(pids: set[int]) -> Silence | None:
    """The longest silence of a peer host to the processes `pids`, from this network namespace's
    `ss`; None where nobody is silent, or `ss` cannot tell."""
    connections = _established() if pids else None
    return None if connections is None else silent_peer(connections, pids)


def unanswered(pids: set[int]) -> Silence | None:
    """A peer host of the processes `pids` with nothing of theirs to acknowledge that answers no
    connection (`unanswered_peer`); None where every peer answers, or `ss` cannot tell."""
    connections = _established() if pids else None
    return None if connections is None else unanswered_peer(connections, pids)
