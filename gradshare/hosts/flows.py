"""A cap class of its own for each TCP connection that leaves an emulated host.

`netns.shape_flows` caps flows with one `htb` class per hash of the source port, because these
kernels have neither `fq` nor `flower`. Ports are random, so two flows can share a class and
then a flow's rate between them: for gloo's four sockets some two share one about one time in
11 (connect ports are even, listen ports odd, one class per low byte), and an arm that should
run at four flows' rate runs at three (a dense update 2.145 s against the 1.717 s its link
projected). A cloud's cap is per flow, never per hash.

`FlowClasses` closes that: a thread inside the namespace reads its TCP table
(`/proc/thread-self/net/tcp`) every `POLL_S` and gives each new connection on the link a slot
of its own: an exact `u32` filter (addresses and ports) in a table ahead of the hash (`TABLE`,
priority 1), whose handle is the slot's and which sends to the slot's class (the table and the
classes: `table_commands`, in `shape_flows`'s batch). A slot's filter is deleted and made again when the slot goes to another connection
(u32's `replace` would keep the old matches), so the table holds `OWN_CLASSES` filters at
most. The hash then carries only a connection's first `POLL_S` or so, and connections beyond
`OWN_CLASSES` at once.

    classes = FlowClasses(ns, addr, "gslink", enter=lambda: in_netns(ns))  # after shape_flows
    ...                                                      # the hosts' processes run
    classes.stop()
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
from typing import Callable, ContextManager

POLL_S = 0.05  # how often the TCP table is read: a connection's first ~50 ms go by the hash
OWN_CLASSES = 64  # connections at once with a class of their own; more share the hash's
FIRST_CLASS = 0x400  # their minor ids, beside the hash's 0x100..0x1ff
TABLE = 3  # the u32 table of the slots' filters (the hash's is 2)
# /proc/net/tcp's `st` of a connection that may still send data: ESTABLISHED, FIN_WAIT1,
# CLOSE_WAIT, LAST_ACK, CLOSING (not LISTEN, SYN_*, FIN_WAIT2, TIME_WAIT, CLOSE)
SENDING = {"01", "04", "08", "09", "0B"}


def proc_addr(addr: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the 32-bit word in this machine's byte
    order, hex."""
    return f"{int.from_bytes(socket.inet_aton(addr), sys.byteorder):08X}"


def _addr(word: str) -> str:
    return socket.inet_ntoa(int(word, 16).to_bytes(4, sys.byteorder))


def connections(table: str, addr: str) -> set[tuple[int, str, int]]:
    """The connections of `table` (/proc/net/tcp's text) from `addr` to another address that
    may still send (`SENDING`): (local port, remote address, remote port) each. (To its own
    address a connection goes by loopback, never the link.)"""
    mine = proc_addr(addr)
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] not in SENDING:
            continue
        local, remote = fields[1].split(":"), fields[2].split(":")
        if local[0] != mine or remote[0] == mine:
            continue
        found.add((int(local[1], 16), _addr(remote[0]), int(remote[1], 16)))
    return found


def leaf_class(ifname: str, minor: int, among: int, flow_mbit: float, rate_mbit: float) -> str:
    """A `tc -batch` line: the htb class 1:`minor`, one of `among` under the total, with a small
    guaranteed share of `rate_mbit` and up to one flow's cap."""
    return (f"class add dev {ifname} parent 1:1 classid 1:{minor:x} htb rate {max(0.01, rate_mbit / among):.3f}mbit "
            f"ceil {min(flow_mbit, rate_mbit)}mbit")


def table_commands(ifname: str, flow_mbit: float, rate_mbit: float) -> list[str]:
    """`tc -batch` lines for `shape_flows`: the slots' classes, and their table at priority 1,
    linked from that priority's root, which passes every packet no slot matches on to priority 2
    (the hash)."""
    return [*(leaf_class(ifname, FIRST_CLASS + k, OWN_CLASSES, flow_mbit, rate_mbit) for k in range(OWN_CLASSES)),
            f"filter add dev {ifname} parent 1: prio 1 handle {TABLE}: protocol ip u32 divisor 1",
            f"filter add dev {ifname} parent 1: prio 1 protocol ip u32 match ip protocol 6 0xff link {TABLE}:"]


class FlowClasses:
    """The watcher of one namespace's connections (module docstring); `stop` ends it. The
    filters it adds go with the namespace. `enter()`: a context that puts the calling thread
    into the namespace (`netns.in_netns`). `errors`: what went wrong, the watcher's own
    exceptions too (it goes on; `given` says how many connections got a slot)."""

    def __init__(self, ns: str, addr: str, ifname: str, enter: Callable[[], ContextManager]):
        self.ns, self.addr, self.ifname, self._enter = ns, addr, ifname, enter
        self.held: dict[tuple[int, str, int], int] = {}  # live connection -> its slot
        self._filtered: set[int] = set()  # slots that have (or may have) a filter
        self.given = 0  # connections given a slot, ever
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"flows-{ns}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._thread.is_alive():  # a `tc` that hangs: the thread, still inside, keeps the namespace
            self.errors.append(f"the watcher of {self.ns} did not end within 5 s")

    def _watch(self) -> None:
        try:
            with self._enter():  # this thread only: /proc/thread-self/net is the namespace's
                with open("/proc/thread-self/net/tcp") as fh:
                    while not self._stop.wait(POLL_S):
                        try:
                            fh.seek(0)
                            self._update(connections(fh.read(), self.addr))
                        except Exception as exc:  # noqa: BLE001 - kept in `errors`; the next poll tries again
                            self._error(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the thread's end, said where the step reports it
            self._error(f"the watcher stopped: {type(exc).__name__}: {exc}")

    def _error(self, what: str) -> None:
        if len(self.errors) < 20:  # the first ones say it; a poll every 50 ms must not fill memory
            self.errors.append(what[:300])

    def _update(self, live: set[tuple[int, str, int]]) -> None:
        for gone in set(self.held) - live:
            del self.held[gone]  # its slot is free; its filter goes when the slot is given again
        new = []
        for conn in sorted(live - set(self.held)):
            free = sorted(set(range(OWN_CLASSES)) - set(self.held.values()))
            if not free:
                break  # more connections than slots: the rest go by the hash
            self.held[conn] = free[0]
            new.append(conn)
        if new:
            self._add_filters(new)

    def _add_filters(self, conns: list[tuple[int, str, int]]) -> None:
        # this thread is inside the namespace, and so is each `tc` it forks
        for conn in conns:
            sport, raddr, dport = conn
            slot = self.held[conn]
            handle = ["handle", f"{TABLE}::{slot + 1:x}", "u32"]
            if slot in self._filtered:  # the slot's old filter first (module docstring)
                subprocess.run(["tc", "filter", "del", "dev", self.ifname, "parent", "1:", "protocol", "ip",
                                "prio", "1", *handle], capture_output=True)
            proc = subprocess.run(
                ["tc", "filter", "add", "dev", self.ifname, "parent", "1:", "protocol", "ip", "prio", "1", *handle,
                 "ht", f"{TABLE}:", "match", "ip", "protocol", "6", "0xff", "match", "ip", "src", f"{self.addr}/32",
                 "match", "ip", "dst", f"{raddr}/32", "match", "ip", "sport", str(sport), "0xffff",
                 "match", "ip", "dport", str(dport), "0xffff", "flowid", f"1:{FIRST_CLASS + slot:x}"],
                capture_output=True, text=True)
            self._filtered.add(slot)  # whatever came of it, the next add there deletes first
            if proc.returncode == 0:
                self.given += 1
            else:  # the next poll tries again
                self._error(proc.stderr.strip())
                del self.held[conn]
