"""A cap class of its own for each TCP connection that leaves an emulated host.

`netns.shape_flows` caps flows with one `htb` class per hash of the source port, because these
kernels have neither `fq` nor `flower`. Ports are random, so two flows can share a class and
then a flow's rate between them: for gloo's four sockets some two share one about one time in
11 (connect ports are even, listen ports odd, one class per low byte), and an arm that should
run at four flows' rate runs at three (a dense update 2.145 s against the 1.717 s its link
projected). A cloud's cap is per flow, never per hash.

`FlowClasses` closes that: a thread inside the namespace reads its TCP table
(`/proc/thread-self/net/tcp`) every `POLL_S` and gives each new established connection on the
link an exact `u32` filter (addresses and ports) to a class no live connection holds, ahead of
the hash, which then carries only a connection's first `POLL_S` or so and connections beyond
`OWN_CLASSES` at once.

    classes = FlowClasses(ns, addr, "gslink", 10, 40, enter=lambda: in_netns(ns))  # after shape_flows
    ...                                                      # the hosts' processes run
    classes.stop()
"""
from __future__ import annotations

import socket
import subprocess
import threading
from typing import Callable, ContextManager

POLL_S = 0.05  # how often the TCP table is read: a connection's first ~50 ms go by the hash
OWN_CLASSES = 64  # connections at once with a class of their own; more share the hash's
FIRST_CLASS = 0x400  # their minor ids, beside the hash's 0x100..0x1ff
ESTABLISHED = "01"  # /proc/net/tcp's `st` column


def proc_addr(addr: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (the 32-bit word in host order, hex)."""
    return socket.inet_aton(addr)[::-1].hex().upper()


def connections(table: str, addr: str) -> set[tuple[int, str, int]]:
    """The established connections of `table` (/proc/net/tcp's text) from `addr`:
    (local port, remote address, remote port) each."""
    mine = proc_addr(addr)
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != ESTABLISHED:
            continue
        local, remote = fields[1].split(":"), fields[2].split(":")
        if local[0] != mine:
            continue
        r = bytes.fromhex(remote[0])[::-1]
        found.add((int(local[1], 16), socket.inet_ntoa(r), int(remote[1], 16)))
    return found


class FlowClasses:
    """The watcher of one namespace's connections (module docstring); `stop` ends it. The
    filters it adds go with the namespace. `enter()`: a context that puts the calling thread
    into the namespace (`netns.in_netns`)."""

    def __init__(self, ns: str, addr: str, ifname: str, flow_mbit: float, rate_mbit: float,
                 enter: Callable[[], ContextManager]):
        self.ns, self.addr, self.ifname, self._enter = ns, addr, ifname, enter
        self.held: dict[tuple[int, str, int], int] = {}  # live connection -> its class
        self.given = 0  # connections given a class of their own, ever
        self.errors: list[str] = []
        self._stop = threading.Event()
        tc = ["ip", "netns", "exec", ns, "tc"]
        batch = [f"class add dev {ifname} parent 1:1 classid 1:{FIRST_CLASS + k:x} htb rate "
                 f"{max(0.01, rate_mbit / OWN_CLASSES):.3f}mbit ceil {min(flow_mbit, rate_mbit)}mbit"
                 for k in range(OWN_CLASSES)]
        proc = subprocess.run(tc + ["-batch", "-"], input="\n".join(batch) + "\n", capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"tc -batch (a class per connection in {ns}) failed: {proc.stderr.strip()[:500]}")
        self._thread = threading.Thread(target=self._watch, name=f"flows-{ns}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        with self._enter():  # this thread only, for good: /proc/thread-self/net is the namespace's
            with open("/proc/thread-self/net/tcp") as fh:
                while not self._stop.wait(POLL_S):
                    fh.seek(0)
                    self._update(connections(fh.read(), self.addr))

    def _update(self, live: set[tuple[int, str, int]]) -> None:
        for gone in set(self.held) - live:
            # its filter stays (u32's handles are the kernel's to give): the same four of
            # addresses and ports coming back soon, to a class that another then holds, is rare
            del self.held[gone]
        new = []
        for conn in sorted(live - set(self.held)):
            free = sorted(set(range(OWN_CLASSES)) - set(self.held.values()))
            if not free:
                break  # more connections than classes: the rest go by the hash
            self.held[conn] = free[0]
            new.append(conn)
        if new:  # gloo opens its sockets together: one `tc` for them all
            self._add_filters(new)

    def _add_filters(self, conns: list[tuple[int, str, int]]) -> None:
        batch = [f"filter add dev {self.ifname} parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff "
                 f"match ip src {self.addr}/32 match ip dst {raddr}/32 match ip sport {sport} 0xffff "
                 f"match ip dport {dport} 0xffff flowid 1:{FIRST_CLASS + self.held[(sport, raddr, dport)]:x}"
                 for sport, raddr, dport in conns]
        # this thread is inside the namespace, and so is the child it forks
        proc = subprocess.run(["tc", "-batch", "-"], input="\n".join(batch) + "\n", capture_output=True, text=True)
        if proc.returncode != 0:
            self.errors.append(proc.stderr.strip()[:300])
        else:
            self.given += len(conns)
