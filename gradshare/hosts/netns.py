"""Two emulated hosts on one machine: two network namespaces joined by a rate-limited link.

    from gradshare.hosts.netns import two_hosts
    with two_hosts(rate_mbit=22) as hosts:           # root, `ip` and `tc` needed
        hosts.bridge(5000)                            # 127.0.0.1:5000 of both hosts -> this one's
        subprocess.run(hosts.host(0) + ["python", ...], env={**os.environ, **hosts.env})

Host i lives in namespace `hosts.ns[i]`; its one interface `gslink` carries
`hosts.addr[i]` (198.18.0.1 and 198.18.0.2, from 198.18.0.0/15, the range set aside for
benchmarking: nothing is ever addressed outside it) and is shaped in its sending
direction by a `tbf` qdisc at the link rate, so each direction of the link carries at most
`rate_mbit`; with `flow_mbit` too, by `htb` classes that cap each TCP connection under that
total (`shape_flows`, `flows.FlowClasses`). Latency is not emulated (`netem` is not available
on these machines).

Names carry the maker's pid and a random tag, so parallel uses never collide; everything is torn down when
the `with` block ends, by an exception too: the processes still inside the namespaces are
killed (by pid), the namespaces deleted (which deletes the veth pair).

The tracking server stays where it is (127.0.0.1 of the namespace that runs this code):
`bridge(port)` listens on 127.0.0.1:port inside each namespace and forwards every
connection to 127.0.0.1:port here, so the same tracking URI works on both hosts. Its bytes
are the hosts' loopback bytes, never the link's: the link carries only what the ranks
exchange.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gradshare.hosts import flows

NETWORK = "198.18.0.0/30"
ADDRS = ("198.18.0.1", "198.18.0.2")
IFNAME = "gslink"  # the link's interface, same name inside both namespaces
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = Path("/var/run/netns")


def unavailable() -> str | None:
    """Why two namespaces cannot be made here, or None where they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (this process is not root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2)"
    probe = f"gradshare-probe-{secrets.token_hex(3)}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@contextlib.contextmanager
def in_netns(name: str):
    """Run the block's socket calls in namespace `name` (this thread only): sockets made
    inside stay there after the block."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(_NETNS_DIR / name, os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
        try:
            yield
        finally:
            if libc.setns(home, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back home")
    finally:
        os.close(home)
        os.close(target)


@dataclass
class TwoHosts:
    tag: str
    rate_mbit: float
    ns: tuple[str, str] = ()
    addr: tuple[str, str] = ADDRS
    _servers: list = field(default_factory=list)
    watchers: list[flows.FlowClasses] = field(default_factory=list)  # with a per-flow cap: one a host

    @property
    def env(self) -> dict[str, str]:
        """Environment for processes on either host: gloo binds the link's interface
        (the machine's host name resolves to an address no namespace has)."""
        return {"GLOO_SOCKET_IFNAME": IFNAME}

    def exec(self, i: int) -> list[str]:
        """Prefix that runs a command in host i's network (`ip`, `tc`, `ss`)."""
        return ["ip", "netns", "exec", self.ns[i]]

    def name(self, i: int) -> str:
        """Host i's host name: two real hosts never share one, and a line naming a rank's host must
        tell the two apart."""
        return f"emulated-host-{i}"

    def host(self, i: int) -> list[str]:
        """Prefix that runs a program as host i: in its network and under its own host name
        (`name`, in a UTS namespace of its own), as a step started on a real host runs."""
        return self.exec(i) + ["unshare", "--uts", "sh", "-c",
                               'echo "$0" > /proc/sys/kernel/hostname && exec "$@"', self.name(i)]

    def counters(self, i: int) -> tuple[int, int]:
        """(rx, tx) bytes of host i's link interface."""
        out = _run(self.exec(i) + ["cat", f"/sys/class/net/{IFNAME}/statistics/rx_bytes",
                                   f"/sys/class/net/{IFNAME}/statistics/tx_bytes"]).stdout.split()
        return int(out[0]), int(out[1])

    def bridge(self, port: int) -> None:
        """127.0.0.1:port in both namespaces forwards to 127.0.0.1:port of this process's
        namespace (for the tracking server); lives until the hosts are torn down."""
        for name in self.ns:
            with in_netns(name):
                srv = socket.socket()
                srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                srv.bind(("127.0.0.1", port))
                srv.listen(64)
            self._servers.append(srv)
            threading.Thread(target=_accept_loop, args=(srv, port), daemon=True).start()

    def close(self) -> None:
        for watcher in self.watchers:
            watcher.stop()
        for srv in self._servers:
            with contextlib.suppress(OSError):
                srv.close()
        for name in self.ns:
            _kill_inside(name)
            _run(["ip", "netns", "del", name], check=False)
        for side in "ab":  # a veth left in this namespace by a set-up that failed half-way
            if Path(f"/sys/class/net/gs{self.tag}{side}").exists():
                _run(["ip", "link", "del", f"gs{self.tag}{side}"], check=False)


def _accept_loop(srv: socket.socket, port: int) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return  # closed at teardown
        try:
            up = socket.create_connection(("127.0.0.1", port))
        except OSError:
            conn.close()
            continue
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def _kill_inside(name: str) -> None:
    """End every process still in namespace `name` (only this module's users put any there)."""
    pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), sig)
        if sig == signal.SIGTERM and pids:
            time.sleep(1)
            pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()


def shape(ns: str, rate_mbit: float) -> None:
    """Limit what `ns` sends on the link to `rate_mbit` (token bucket)."""
    burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 * 0.004))  # >= one GSO segment, ~4 ms of traffic
    _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", IFNAME, "root", "tbf",
          "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "400ms"])


FLOW_BUCKETS = 256  # one htb class per value of a TCP source port's low byte


def shape_flows(ns: str, rate_mbit: float, flow_mbit: float) -> None:
    """Limit what `ns` sends on the link to `rate_mbit` in all and `flow_mbit` per TCP flow, the
    way a cloud network caps flows between instances outside a placement group (AWS: 5 Gbit/s
    per flow). The kernels here have `htb` and the `u32` classifier but not `fq`, `sfq` or
    `flower`: an `htb` root at the total rate, one leaf class per low byte of the TCP source
    port, each at the flow rate, and a `u32` hash table on that byte (at priority 2) that sends
    each packet to its leaf. Two flows whose ports share the low byte would share a cap, so
    `setup` also starts `flows.FlowClasses`, which gives each connection a class of its own by
    an exact filter at priority 1: the hash carries a connection only for its first moments."""
    tc = ["ip", "netns", "exec", ns, "tc"]
    _run(tc + ["qdisc", "replace", "dev", IFNAME, "root", "handle", "1:", "htb", "default", "2"])
    _run(tc + ["class", "add", "dev", IFNAME, "parent", "1:", "classid", "1:1", "htb",
               "rate", f"{rate_mbit}mbit", "ceil", f"{rate_mbit}mbit"])
    # everything not TCP (ARP, ICMP) beside the flows, under the same total
    _run(tc + ["class", "add", "dev", IFNAME, "parent", "1:1", "classid", "1:2", "htb",
               "rate", f"{min(flow_mbit, rate_mbit)}mbit", "ceil", f"{rate_mbit}mbit"])
    batch = [flows.leaf_class(IFNAME, 0x100 + b, FLOW_BUCKETS, flow_mbit, rate_mbit) for b in range(FLOW_BUCKETS)]
    # priority 2: `flows.FlowClasses` puts its exact filters ahead, at 1, in a table of their own
    batch.extend(flows.table_commands(IFNAME, flow_mbit, rate_mbit))
    batch.append(f"filter add dev {IFNAME} parent 1: prio 2 handle 2: protocol ip u32 divisor {FLOW_BUCKETS}")
    # the TCP header starts at byte 20 of an IP packet without options; its first word holds the
    # source port in its high half: the low byte of that port picks the bucket
    batch.append(f"filter add dev {IFNAME} protocol ip parent 1: prio 2 u32 match ip protocol 6 0xff "
                 f"hashkey mask 0x00ff0000 at 20 link 2:")
    for b in range(FLOW_BUCKETS):
        batch.append(f"filter add dev {IFNAME} protocol ip parent 1: prio 2 u32 ht 2:{b:x}: match u32 0 0 "
                     f"flowid 1:{0x100 + b:x}")
    proc = subprocess.run(tc + ["-batch", "-"], input="\n".join(batch) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"tc -batch (per-flow shaping in {ns}) failed: {proc.stderr.strip()[:500]}")


def setup(rate_mbit: float, tag: str | None = None, flow_mbit: float = 0.0) -> TwoHosts:
    """Make the two hosts; on any failure, undo what was made and raise. `flow_mbit` > 0: each
    TCP flow is capped at it too (`shape_flows`), under the link's `rate_mbit`."""
    if rate_mbit <= 0:
        raise ValueError("rate_mbit must be > 0")
    # the owner's pid in every name: `leftovers(stale=True)` tells an abandoned pair from a live one
    tag = tag or f"{os.getpid()}x{secrets.token_hex(2)}"
    hosts = TwoHosts(tag=tag, rate_mbit=rate_mbit, ns=(f"gradshare-{tag}-a", f"gradshare-{tag}-b"))
    try:
        for name in hosts.ns:
            _run(["ip", "netns", "add", name])
        _run(["ip", "link", "add", f"gs{tag}a", "type", "veth", "peer", "name", f"gs{tag}b"])
        for side, name, addr in zip("ab", hosts.ns, hosts.addr):
            _run(["ip", "link", "set", f"gs{tag}{side}", "netns", name])
            _run(["ip", "-n", name, "link", "set", f"gs{tag}{side}", "name", IFNAME])
            _run(["ip", "-n", name, "addr", "add", f"{addr}/30", "dev", IFNAME])
            _run(["ip", "-n", name, "link", "set", IFNAME, "up"])
            _run(["ip", "-n", name, "link", "set", "lo", "up"])
            if flow_mbit > 0:
                shape_flows(name, rate_mbit, flow_mbit)
                hosts.watchers.append(flows.FlowClasses(name, addr, IFNAME, enter=lambda name=name: in_netns(name)))
            else:
                shape(name, rate_mbit)
    except BaseException:
        hosts.close()
        raise
    return hosts


@contextlib.contextmanager
def two_hosts(rate_mbit: float, tag: str | None = None, flow_mbit: float = 0.0):
    """Two emulated hosts for the block; torn down on exit, on failure too."""
    hosts = setup(rate_mbit, tag, flow_mbit)
    try:
        yield hosts
    finally:
        hosts.close()


def leftovers(stale: bool = False) -> list[str]:
    """Namespaces this module made that still exist; `stale`: only those whose maker is gone."""
    out = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    names = [line.split()[0] for line in out if line.startswith("gradshare-")]
    return [n for n in names if not stale or not _alive(n)]


def _alive(name: str) -> bool:
    try:
        pid = int(name.split("-")[1].split("x")[0])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def measure_mbit(hosts: TwoHosts, megabytes: float = 4.0, sender: int = 0, streams: int = 1,
                 source_ports: list[int] | None = None, timeout_s: float = 600.0) -> float:
    """Goodput of `streams` TCP streams at once from host `sender` to the other, Mbit/s in all
    (a check of the shaping: with a per-flow cap, one stream gets the flow's rate). Each stream
    leaves from the port of `source_ports` at its index, or the kernel's choice (None, 0).

    A stream that fails (its socket refused, its peer gone before every byte arrived, not done
    in `timeout_s`) raises `LinkMeasurementError` with its reason: a rate from the streams that
    did finish would read high."""
    ports = list(source_ports or [0] * streams)
    if len(ports) != streams:
        raise ValueError(f"{streams} streams need as many source ports, not {len(ports)}")
    if streams > 1:
        errors: list[BaseException] = []

        def one(port: int) -> None:
            try:
                measure_mbit(hosts, megabytes / streams, sender, 1, [port], timeout_s)
            except BaseException as exc:  # noqa: BLE001 - kept, and raised on the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(port,), daemon=True) for port in ports]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:  # one deadline for all of them
            t.join(timeout=max(0.0, t0 + timeout_s - time.perf_counter()))
        s = time.perf_counter() - t0
        late = sum(t.is_alive() for t in threads)
        if late:
            errors.append(LinkMeasurementError(f"{late} stream(s) still running after {timeout_s:g} s"))
        if errors:
            raise LinkMeasurementError(f"{len(errors)} of {streams} streams from host {sender} failed; "
                                       f"the first: {errors[0]}") from errors[0]
        return megabytes * 8 / s

    receiver = 1 - sender
    deadline = time.perf_counter() + timeout_s  # connect, send and receive: all within it
    with in_netns(hosts.ns[receiver]):
        srv = socket.socket()
        srv.bind((hosts.addr[receiver], 0))
        srv.listen(1)
    srv.settimeout(timeout_s)
    port = srv.getsockname()[1]
    total = int(megabytes * 1e6)
    got: list[float] = []
    received = [0]
    errors = []

    def drain():
        try:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(timeout_s)
                while received[0] < total and (data := conn.recv(1 << 16)):
                    received[0] += len(data)
            got.append(time.perf_counter())
        except OSError as exc:
            errors.append(exc)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        try:
            with in_netns(hosts.ns[sender]):
                cli = socket.create_connection((hosts.addr[receiver], port), timeout=timeout_s,
                                               source_address=(hosts.addr[sender], ports[0]))
            with cli:
                t0 = time.perf_counter()
                cli.sendall(b"\0" * total)
        except OSError as exc:
            with contextlib.suppress(OSError):
                srv.shutdown(socket.SHUT_RDWR)  # wakes the receiver's accept (a close alone does not)
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
            raise LinkMeasurementError(f"the stream from host {sender} (source port {ports[0] or 'any'}) "
                                       f"failed: {exc}") from exc
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    finally:
        srv.close()
    if errors:
        raise LinkMeasurementError(f"the receiver on host {receiver} failed: {errors[0]}") from errors[0]
    if t.is_alive() or not got:
        raise LinkMeasurementError(f"the receiver on host {receiver} did not finish in {timeout_s:g} s")
    if received[0] < total:
        raise LinkMeasurementError(f"the stream from host {sender} ended after {received[0]:,} of {total:,} bytes")
    return total * 8 / 1e6 / (got[0] - t0)


class LinkMeasurementError(RuntimeError):
    """A stream of `measure_mbit` failed: no rate can be given for it."""
