"""A partitioned link is told from a hung rank (`gradshare.hosts.silence`), on real TCP connections
between two emulated hosts: data waiting unacknowledged on a link taken down is silence, growing
with the time the link is down, and it ends when the link returns; a peer that stops reading (a
hung rank: its kernel still answers) and an idle link are never silence. Skipped with the reason
where namespaces cannot be made."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time

import pytest

from gradshare.hosts import netns, silence

REASON = netns.unavailable()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts here: {REASON}")


def _connections(hosts, i: int) -> list[silence.Connection]:
    out = subprocess.run(hosts.exec(i) + ["ss", "-tinpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout
    return silence.parse(out)


def _pair(hosts):
    """A connection from host 0 to host 1: (the client socket, on host 0; the accepted one, on host 1)."""
    with netns.in_netns(hosts.ns[1]):
        srv = socket.socket()
        srv.bind((hosts.addr[1], 0))
        srv.listen(1)
    with netns.in_netns(hosts.ns[0]):
        cli = socket.create_connection((hosts.addr[1], srv.getsockname()[1]), timeout=10)
    conn, _ = srv.accept()
    srv.close()
    return cli, conn


def _read(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed at the test's end
        while conn.recv(1 << 20):
            pass


@needs_hosts
def test_data_waiting_on_a_downed_link_is_silence_and_a_peer_that_stops_reading_is_not():
    me = {os.getpid()}
    with netns.two_hosts(rate_mbit=200) as hosts:
        cli, conn = _pair(hosts)
        # idle: nothing waits on the peer, however long ago it spoke
        time.sleep(1.2)
        assert silence.silent_peer(_connections(hosts, 0), me) is None
        # the peer stops reading (a hung rank): the send queue fills, its kernel still answers
        cli.setblocking(False)
        sent = 0
        try:
            while True:
                sent += cli.send(b"\0" * 65536)
        except BlockingIOError:
            pass
        time.sleep(3)
        [c] = [c for c in _connections(hosts, 0) if c.peer == hosts.addr[1]]
        assert c.send_q > 0, c
        assert silence.silent_peer(_connections(hosts, 0), me) is None, (sent, c)
        cli.close()
        conn.close()
        # a peer that reads, and a sender that keeps sending, as the ranks of an all-reduce do
        cli, conn = _pair(hosts)
        threading.Thread(target=_read, args=(conn,), daemon=True).start()

        def send():
            with contextlib.suppress(OSError):
                while True:
                    cli.sendall(b"\0" * 100_000)
                    time.sleep(0.05)

        threading.Thread(target=send, daemon=True).start()
        time.sleep(1)
        flowing = silence.silent_peer(_connections(hosts, 0), me)  # data in flight, answered at once
        assert flowing is None or flowing.seconds < 1.0, flowing
        # the link goes down with data waiting: silence, growing, named by the peer's address
        subprocess.run(hosts.exec(0) + ["ip", "link", "set", netns.IFNAME, "down"], check=True)
        t_down = time.monotonic()
        time.sleep(3)
        first = silence.silent_peer(_connections(hosts, 0), me)
        assert first is not None and first.addr == hosts.addr[1]
        assert 2.0 <= first.seconds <= time.monotonic() - t_down + 1.0, first
        time.sleep(2)
        later = silence.silent_peer(_connections(hosts, 0), me)
        assert later.seconds >= first.seconds + 1.5, (first, later)
        # the link returns: the next retransmission is answered and the silence ends
        subprocess.run(hosts.exec(0) + ["ip", "link", "set", netns.IFNAME, "up"], check=True)
        deadline = time.monotonic() + 30
        while silence.silent_peer(_connections(hosts, 0), me) is not None:
            assert time.monotonic() < deadline, "still silent 30 s after the link came back"
            time.sleep(0.5)
        cli.close()
        conn.close()


SS = """\
0      0      127.0.0.1:45818 127.0.0.1:60393 users:(("python",pid=11,fd=4))
\t bbr wscale:10,10 rto:200 lastsnd:8 lastrcv:90000 lastack:90000 snd_wnd:65483
0      4096   127.0.0.1:45819 127.0.0.1:5000 users:(("python",pid=11,fd=5))
\t bbr wscale:10,10 rto:200 lastsnd:8 lastrcv:90000 lastack:90000 snd_wnd:65483
0      165160 198.18.0.1:33500 198.18.0.2:59495 users:(("pt_main_thread",pid=11,fd=7))
\t bbr rto:26112 backoff:7 lastsnd:29660 lastrcv:32068 lastack:30060 snd_wnd:1530880
0      0      198.18.0.1:33502 198.18.0.2:59499 users:(("pt_main_thread",pid=11,fd=8))
\t bbr rto:200 lastsnd:40000 lastrcv:41000 lastack:45000 snd_wnd:1530880
0      9000   [::ffff:198.18.0.1]:29500 [::ffff:198.18.0.3]:40100 users:(("pt_main_thread",pid=12,fd=9))
\t bbr rto:26112 backoff:7 lastsnd:29660 lastrcv:99000 lastack:99000 rwnd_limited:1964ms(97.6%)
0      70     198.18.0.1:33504 198.18.0.4:59499 users:(("other",pid=99,fd=8))
\t bbr rto:26112 lastsnd:40000 lastrcv:500000 lastack:500000 snd_wnd:1530880
0      5000   198.18.0.1:33506 198.18.0.5:59499 users:(("other",pid=98,fd=8))
\t bbr rto:200 lastsnd:2 lastrcv:8000 snd_wnd:1530880
"""


def test_silence_is_the_most_recent_word_from_a_peer_that_owes_an_answer_on_the_ranks_own_connections():
    conns = silence.parse(SS)
    assert [c.peer for c in conns] == ["127.0.0.1", "127.0.0.1", "198.18.0.2", "198.18.0.2", "198.18.0.3",
                                       "198.18.0.4", "198.18.0.5"]
    assert conns[2].send_q == 165160 and conns[2].last_heard_ms == 30060 and conns[2].pids == {11}
    # loopback never counts (the tracking server); 198.18.0.2: the most recent word on any of its
    # connections (30.06 s, not the idle one's 41 s); .3: its window is closed (no `snd_wnd`, which
    # ss leaves out where it is 0), it answers; .4: not a rank's
    assert silence.silent_peer(conns, {11, 12}) == silence.Silence("198.18.0.2", 30.06)
    assert silence.silent_peer(conns, {12}) is None
    assert silence.silent_peer(conns, {99}) == silence.Silence("198.18.0.4", 500.0)
    assert silence.silent_peer(conns, set()) is None
    # `ss` leaves out `lastack:0`: an ACK this very millisecond, not one never seen
    assert conns[-1].last_heard_ms == 0 and silence.silent_peer(conns, {98}) == silence.Silence("198.18.0.5", 0.0)
    # a kernel that reports no window (before 6.2): a missing `snd_wnd` says nothing
    old = silence.parse(SS.replace(" snd_wnd:65483", "").replace(" snd_wnd:1530880", ""), window_reported=False)
    assert not any(c.window_closed for c in old)
    assert silence.silent_peer(old, {12}) == silence.Silence("198.18.0.3", 99.0)
    assert silence.kernel_reports_window("6.2.0-1") and silence.kernel_reports_window("6.18.44-fc")
    assert not silence.kernel_reports_window("6.1.55") and not silence.kernel_reports_window("5.15.0-91-generic")


IDLE = """\
0      0      198.18.0.1:33500 198.18.0.2:59495 users:(("pt_main_thread",pid=11,fd=7))
\t bbr rto:200 lastsnd:29660 lastrcv:32068 lastack:30060 snd_wnd:1530880
0      0      198.18.0.1:33502 198.18.0.2:29500 users:(("pt_main_thread",pid=11,fd=8))
\t bbr rto:200 lastsnd:40000 lastrcv:41000 lastack:45000 snd_wnd:1530880
0      0      127.0.0.1:45818 127.0.0.1:60393 users:(("python",pid=11,fd=4))
\t bbr rto:200 lastsnd:8 lastrcv:90000 lastack:90000 snd_wnd:65483
0      700    198.18.0.1:33504 198.18.0.3:40100 users:(("pt_main_thread",pid=11,fd=9))
\t bbr rto:200 lastsnd:8 lastrcv:7000 lastack:7000 snd_wnd:65483
0      0      198.18.0.1:33506 198.18.0.4:40100 users:(("other",pid=99,fd=9))
\t bbr rto:200 lastsnd:8 lastrcv:500000 lastack:500000 snd_wnd:65483
"""


def test_a_peer_owed_nothing_is_asked_on_the_ports_the_ranks_use_and_silent_only_where_it_does_not_answer():
    conns = silence.parse(IDLE)
    assert [c.peer_port for c in conns] == [59495, 29500, 60393, 40100, 40100]
    asked = []

    def nobody(addr, ports):
        asked.append((addr, ports))
        return False

    # .2: nothing waits, no answer: silent since its most recent word on either connection (30.06 s);
    # .3 has data waiting (the queues' to read: `silent_peer`), loopback and another process's never asked
    unanswered = silence.unanswered_peer(conns, {11}, nobody)
    assert unanswered == silence.Silence("198.18.0.2", 30.06, "this host's ranks wait for it and it answers no connection")
    assert asked == [("198.18.0.2", [29500, 59495])]
    assert silence.unanswered_peer(conns, {11}, lambda addr, ports: True) is None
    assert silence.unanswered_peer(conns, set(), nobody) is None


@needs_hosts
def test_a_downed_link_leaves_a_waiting_receiver_a_peer_that_answers_no_connection_and_a_live_one_answers():
    """Host 1's side of a connection from host 0 holds nothing unacknowledged (it only waits to
    receive): the queues cannot show the link down, a new connection can."""
    me = {os.getpid()}
    with netns.two_hosts(rate_mbit=200) as hosts:
        cli, conn = _pair(hosts)
        cli.sendall(b"\0" * 1000)
        conn.recv(1000)
        time.sleep(0.3)
        # a peer that is there answers, however long it has been quiet: a hung rank stays the heartbeat's
        with netns.in_netns(hosts.ns[1]):
            assert silence.unanswered_peer(_connections(hosts, 1), me) is None
        with netns.in_netns(hosts.ns[0]):
            assert silence.unanswered_peer(_connections(hosts, 0), me) is None
        subprocess.run(hosts.exec(0) + ["ip", "link", "set", netns.IFNAME, "down"], check=True)
        t_down = time.monotonic()
        time.sleep(1.0)
        for side, peer in ((1, 0), (0, 1)):  # no answer from either side: a timeout, no route
            assert silence.silent_peer(_connections(hosts, side), me) is None  # nothing waits in the queues
            with netns.in_netns(hosts.ns[side]):
                gone = silence.unanswered_peer(_connections(hosts, side), me)
            assert gone is not None and gone.addr == hosts.addr[peer], (side, gone)
            assert 1.0 <= gone.seconds <= time.monotonic() - t_down + 1.5, (side, gone)
        subprocess.run(hosts.exec(0) + ["ip", "link", "set", netns.IFNAME, "up"], check=True)
        deadline = time.monotonic() + 10
        while True:
            with netns.in_netns(hosts.ns[1]):
                if silence.unanswered_peer(_connections(hosts, 1), me) is None:
                    break
            assert time.monotonic() < deadline, "host 0 still unanswered 10 s after the link came back"
            time.sleep(0.2)
        cli.close()
        conn.close()
