"""The one-line reason of a failed launch (`gradshare.train.failures`), from torch elastic's own
failure summary (made here by torch's `ChildFailedError`, not written by hand) and the ranks'
own reason files."""
from __future__ import annotations

import signal
import socket

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from gradshare.train import failures
from gradshare.train.workdir import WORKERS_LOG


def _summary(exits: dict[int, int], first: int | None = None) -> str:
    """torch elastic's summary for ranks that ended with these exit codes (negative: a signal);
    `first`: the rank whose failure torch saw first (its root cause)."""
    procs = {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="")
             for rank, code in exits.items()}
    if first is not None:
        for rank, proc in procs.items():
            proc.timestamp = 1_000 if rank == first else 2_000
    return "Traceback (most recent call last):\n  ...\n" + str(ChildFailedError("gradshare.train.worker", procs))


def test_the_launchers_summary_names_each_failed_rank_its_exit_and_host():
    exits = failures.launcher_exits(_summary({0: 1, 1: -signal.SIGKILL}))
    assert sorted((e.rank, e.exitcode) for e in exits) == [(0, 1), (1, -9)]
    assert {e.host for e in exits} == {socket.getfqdn()}
    assert {e.rank: e.signal_name for e in exits} == {0: None, 1: "SIGKILL"}


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_peer_that_lost_it(tmp_path):
    (tmp_path / "failure.rank0.txt").write_text("RuntimeError: [../third_party/gloo/...] Connection closed by peer "
                                                "[198.18.0.2]:29500 " + "x" * 900)
    (tmp_path / WORKERS_LOG).write_text(_summary({0: 1, 1: -signal.SIGKILL}))
    reason, details = failures.explain(tmp_path, "dense", 1)
    assert reason == (f"arm dense: rank 1 on host {socket.getfqdn()} was killed by SIGKILL (exit code -9)")
    assert "Connection closed by peer" in details and "exitcode" in details  # the chain, kept whole


def test_a_study_limit_or_divergence_is_passed_on_in_its_own_words(tmp_path):
    (tmp_path / "failure.rank1.txt").write_text("RuntimeError: peer gone")
    (tmp_path / "failure.rank0.txt").write_text("deadline: the study's deadline passes after update 3")
    (tmp_path / WORKERS_LOG).write_text(_summary({0: 1, 1: 1}))
    assert failures.explain(tmp_path, "dense", 1)[0] == "deadline: the study's deadline passes after update 3"


def test_one_process_killed_reads_from_accelerates_simple_launcher(tmp_path):
    (tmp_path / WORKERS_LOG).write_text(
        "subprocess.CalledProcessError: Command '['python', '-m', 'gradshare.train.worker']' died with "
        "<Signals.SIGKILL: 9>.\n")
    reason, _ = failures.explain(tmp_path, "single", 1)
    assert reason == (f"arm single: rank 0 on host {socket.gethostname()} was killed by SIGKILL (exit code -9)")


def test_a_rank_that_failed_on_its_own_is_named_with_its_reason(tmp_path):
    (tmp_path / "failure.rank1.txt").write_text("ValueError: bad shard")
    (tmp_path / WORKERS_LOG).write_text(_summary({1: 1}))
    assert failures.explain(tmp_path, "dense", 1)[0] == (f"arm dense: rank 1 on host {socket.getfqdn()} failed: "
                                                          f"ValueError: bad shard")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert failures.explain(empty, "dense", 3)[0] == "arm dense: a worker process exited with code 3 and left no reason"


def test_the_rank_that_failed_first_is_named_not_the_one_the_agent_stopped_after_it(tmp_path):
    """Rank 1 SIGKILLed after the last update; torch elastic then stops rank 0 with SIGTERM. Its
    summary lists rank 0 under "Failures" and rank 1 as the root cause: rank 1 and SIGKILL."""
    (tmp_path / WORKERS_LOG).write_text(_summary({0: -signal.SIGTERM, 1: -signal.SIGKILL}, first=1))
    assert [e.rank for e in failures.launcher_exits((tmp_path / WORKERS_LOG).read_text())] == [1, 0]
    reason, _ = failures.explain(tmp_path, "dense", 1)
    assert reason == f"arm dense: rank 1 on host {socket.getfqdn()} was killed by SIGKILL (exit code -9)"
    (tmp_path / WORKERS_LOG).write_text(_summary({0: -signal.SIGTERM, 1: -signal.SIGKILL}, first=0))
    assert failures.explain(tmp_path, "dense", 1)[0].startswith("arm dense: rank 0 ")  # the other order too


def test_of_two_ranks_with_ordinary_reasons_the_first_observed_failure_is_named(tmp_path):
    """Both ranks exit 1, each with a reason of its own: the launcher's root cause is the arm's
    reason, whichever rank it is; its peer's reason (the connection it lost) is a consequence."""
    (tmp_path / "failure.rank0.txt").write_text("RuntimeError: Connection closed by peer")
    (tmp_path / "failure.rank1.txt").write_text("ValueError: bad shard")
    (tmp_path / WORKERS_LOG).write_text(_summary({0: 1, 1: 1}, first=1))
    host = socket.getfqdn()
    assert failures.explain(tmp_path, "dense", 1)[0] == f"arm dense: rank 1 on host {host} failed: ValueError: bad shard"
    (tmp_path / WORKERS_LOG).write_text(_summary({0: 1, 1: 1}, first=0))
    assert failures.explain(tmp_path, "dense", 1)[0] == (f"arm dense: rank 0 on host {host} failed: "
                                                          f"RuntimeError: Connection closed by peer")


def test_a_rank_the_agent_stopped_after_a_peers_own_error_is_not_the_cause(tmp_path):
    """Rank 0 fails on its own (the store refused the checkpoint) and torch elastic stops rank 1
    with SIGTERM: the arm's reason is the refusal, not "rank 1 ... killed by SIGTERM" (issue 44)."""
    refused = "the artifact store refused the trained checkpoint (quota exceeded); every update is done"
    (tmp_path / "failure.rank0.txt").write_text(refused)
    (tmp_path / WORKERS_LOG).write_text(_summary({0: 1, 1: -signal.SIGTERM}, first=1))
    assert failures.explain(tmp_path, "dense", 1)[0] == refused
    (tmp_path / "failure.rank0.txt").write_text("ValueError: bad shard")  # an ordinary reason: still the cause
    assert failures.explain(tmp_path, "dense", 1)[0] == (f"arm dense: rank 0 on host {socket.getfqdn()} failed: "
                                                          f"ValueError: bad shard")
    # SIGKILL is no launcher's stop: the killed rank stays the cause
    (tmp_path / WORKERS_LOG).write_text(_summary({0: 1, 1: -signal.SIGKILL}, first=1))
    assert "was killed by SIGKILL" in failures.explain(tmp_path, "dense", 1)[0]
