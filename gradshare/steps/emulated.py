"""One two-process arm across two emulated hosts (`gradshare.hosts.netns`), each machine rank
started with `mlflow run` inside its own network namespace, exactly as a person starts
the two machine ranks of an arm on two real hosts.

    from gradshare.steps.emulated import choose_link, run_arm_across
    link = choose_link("auto", plan)          # emulated when the machine allows it, else loopback
    if link.emulated:
        ok = run_arm_across("gradshare-tiny", "dense", plan.link.rate_mbit)

Used by the `study` entry point and by `scripts/two_hosts.py run`. The arm's MLflow run
(machine rank 0) records which link carried it in its `link` parameter, from
`GRADSHARE_LINK` set here; the report prints it.

The tracking store stays where it is: a SQLite or file store is the same file seen from
both namespaces; a server on this machine's loopback (http://127.0.0.1:PORT) is reached
through `TwoHosts.bridge`. A server anywhere else cannot be reached from the namespaces
(their only interface is the link), so that case runs over loopback and says why.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from gradshare.contract.tags import ATTEMPT
from gradshare.hosts import netns
from gradshare.tracking import study_runs
from gradshare.train.env import LINK_ENV, RATE_ENV


REPO = Path(__file__).resolve().parents[2]  # the checkout: its MLproject launches every step
MODES = ("auto", "emulated", "loopback")
RENDEZVOUS_PORT = 29500  # on host 0's link address: a fresh namespace, nothing else listens there
# After machine rank 0 ends, how long host 1 may take to notice and exit before teardown kills it.
SECONDARY_GRACE_S = 60


@dataclass(frozen=True)
class Link:
    emulated: bool
    note: str
    """One line for the output and the report: what carried the two-process arms, and why."""


def describe_emulated(rate_mbit: float) -> str:
    return (f"emulated: two hosts (network namespaces) joined by a {rate_mbit:g} Mbit/s link each way "
            f"(tc tbf); latency not emulated")


def _tracking_problem() -> str | None:
    """Why the tracking store cannot be reached from inside the namespaces, or None."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        host = urlparse(uri).hostname
        if host not in ("127.0.0.1", "localhost") or not urlparse(uri).port:
            return (f"the tracking server {uri} is not on this machine's loopback; the emulated hosts "
                    f"reach only 127.0.0.1:PORT of this machine")
        return None
    if scheme in ("", "file", "sqlite"):
        return None
    return f"tracking URI scheme {scheme!r} is not known to be reachable from the emulated hosts"


def choose_link(mode: str, plan) -> Link:
    """Which link the two-process arms use: `emulated` refuses where it cannot be made;
    `auto` falls back to loopback with the reason; `loopback` is asked for."""
    if mode not in MODES:
        raise SystemExit(f"hosts={mode!r}: choose one of {', '.join(MODES)}")
    if mode == "loopback":
        return Link(False, "loopback: both ranks on one host, as asked (hosts=loopback); no byte crossed a link")
    reason = None
    if plan.hardware.device != "cpu":
        reason = "the arms run on GPUs: emulated hosts are for the CPU profile"
    reason = reason or netns.unavailable() or _tracking_problem()
    if reason is None:
        return Link(True, describe_emulated(plan.link.rate_mbit))
    if mode == "emulated":
        raise SystemExit(f"hosts=emulated: cannot make emulated hosts here: {reason}")
    return Link(False, f"loopback: both ranks on one host, no byte crossed a link ({reason})")


def absolute_tracking_env() -> dict[str, str]:
    """MLFLOW_TRACKING_URI for the machine ranks, a relative SQLite or file path made absolute
    (the ranks' `mlflow run` may start elsewhere)."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite" and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    elif parsed.scheme in ("", "file") and not Path(parsed.path).is_absolute():
        uri = Path(parsed.path).resolve().as_uri()
    return {"MLFLOW_TRACKING_URI": uri}


def machine_rank_command(study: str, arm: str, rank: int, addr0: str, port: int = RENDEZVOUS_PORT) -> list[str]:
    """`mlflow run` of the train entry point for one machine rank, the README's way."""
    return [sys.executable, "-m", "mlflow", "run", str(REPO), "-e", "train", "--env-manager", "local",
            "--experiment-name", study, "-P", f"study={study}", "-P", f"arm={arm}", "-P", "num_machines=2",
            "-P", f"machine_rank={rank}", "-P", f"main_process_ip={addr0}", "-P", f"main_process_port={port}"]


def _pump(stream, prefix: str) -> None:
    for line in stream:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()


def _wait_for_claim(study: str, arm: str, host0: subprocess.Popen, timeout_s: float) -> None:
    """Until machine rank 0's train run is RUNNING with its attempt decided, or rank 0 ended."""

    deadline = time.monotonic() + timeout_s
    while host0.poll() is None and time.monotonic() < deadline:
        if any(ATTEMPT in r.data.tags for r in study_runs.search(study, "train", arm, status="RUNNING")):
            return
        time.sleep(0.5)


def _host_env(**extra: str) -> dict[str, str]:
    """The environment of a step run on the emulated hosts: each machine rank makes its own run,
    so nothing of a launcher's run may leak in; the tracking URI absolute (the hosts' cwd differs)."""
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    return {**inherited, "PYTHONUNBUFFERED": "1", **absolute_tracking_env(), **extra}


# After an interrupt, how long each host's step may take to stop its processes and end its run
# (the train step's own grace for its ranks is 10 s) before the hosts are torn down.
STOP_WAIT_S = 60


def _wait_or_pass_on_a_stop(procs: list[subprocess.Popen], timeout_s: float) -> int:
    """Host 0's exit code; an interrupt of this process (SIGTERM, Ctrl-C) is passed on to each
    host's step as SIGTERM, and each is waited for (`STOP_WAIT_S`) so that its run ends KILLED
    "interrupted" before the hosts are torn down; then the interrupt goes on."""
    try:
        return procs[0].wait(timeout=timeout_s)
    except KeyboardInterrupt:
        print("[gradshare] interrupted: stopping the step on each host (SIGTERM)", flush=True)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        raise


def _on_two_hosts(what: str, command, env: dict[str, str], rate_mbit: float, flow_mbit: float, timeout_s: float,
                  before_host_1=None, meanwhile=None) -> int | None:
    """`command(rank, addr0)` as machine rank 0 on host 0 and 1 on host 1 over a fresh link, torn
    down afterwards (on failure and interrupt too); host 0's exit code, None where it passed
    `timeout_s`. `before_host_1(host 0's process)` waits for what host 1 needs; where host 0 has
    ended by then, host 1 never starts. `meanwhile(hosts)`, once both hosts run, on a thread of
    its own (a fault injected into the link: its tests)."""
    uri = urlparse(env["MLFLOW_TRACKING_URI"])
    with netns.two_hosts(rate_mbit, flow_mbit=flow_mbit) as hosts:
        if uri.scheme in ("http", "https"):
            hosts.bridge(uri.port)
        env = {**env, **hosts.env}
        procs, pumps = [], []
        for rank in (0, 1):
            if rank == 1 and before_host_1 is not None:
                before_host_1(procs[0])
                if procs[0].poll() is not None:
                    break  # host 0 ended (refused, failed): nothing for host 1 to join
            p = subprocess.Popen(hosts.host(rank) + command(rank, hosts.addr[0]),
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            t = threading.Thread(target=_pump, args=(p.stdout, f"[host {rank}] "), daemon=True)
            t.start()
            procs.append(p)
            pumps.append(t)
        if meanwhile is not None and len(procs) == 2:
            threading.Thread(target=meanwhile, args=(hosts,), daemon=True).start()
        try:
            rc0 = _wait_or_pass_on_a_stop(procs, timeout_s)
            try:
                if len(procs) > 1:
                    procs[1].wait(timeout=SECONDARY_GRACE_S)
            except subprocess.TimeoutExpired:
                print(f"[gradshare] host 1 still running {SECONDARY_GRACE_S}s after host 0 ended: stopped",
                      flush=True)
        except subprocess.TimeoutExpired:
            print(f"[gradshare] {what} across two hosts passed {timeout_s:.0f}s: stopped", flush=True)
            rc0 = None
        for i, watcher in enumerate(hosts.watchers):  # a per-flow cap: did each connection get its own?
            print(f"[gradshare] emulated link, host {i}: {watcher.given} connection(s) given a flow class of "
                  f"their own" + (f"; its first error: {watcher.errors[0]}" if watcher.errors else ""), flush=True)
        # leaving the block tears the hosts down and kills what is still inside, by pid
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for t in pumps:
        t.join(timeout=5)
    return rc0


def run_preflight_across(study: str, rate_mbit: float, timeout_s: float, flow_mbit: float = 0.0) -> int:
    """`gradshare preflight` with machine rank 0 on host 0 and 1 on host 1 over a fresh link
    (`flow_mbit` > 0: each TCP flow capped too); host 0's exit code (0 go, 3 no-go; -1: it passed
    `timeout_s`)."""
    def command(rank: int, addr0: str) -> list[str]:
        return [sys.executable, "-m", "entrypoints.preflight", "--study", study, "--num-machines", "2",
                "--machine-rank", str(rank), "--main-process-ip", addr0, "--main-process-port", str(RENDEZVOUS_PORT)]

    rc0 = _on_two_hosts("the preflight", command, _host_env(), rate_mbit, flow_mbit, timeout_s)
    return -1 if rc0 is None else rc0


def run_arm_across(study: str, arm: str, rate_mbit: float, timeout_s: float, flow_mbit: float = 0.0,
                   meanwhile=None) -> bool:
    """Machine rank 0 on host 0 and machine rank 1 on host 1 over a fresh link, torn down
    afterwards (on failure and interrupt too). True when machine rank 0 ended well: its
    MLflow run holds the arm's outcome either way. `flow_mbit` > 0: each TCP flow capped too.
    Host 1 starts once host 0's run holds the arm (its claim decided): a refused arm never leaves
    host 1 waiting at the rendezvous, and host 0's orphan sweep never meets host 1's launcher run
    before that run is tagged as alive. `meanwhile(hosts)` runs beside the arm (see `_on_two_hosts`)."""
    env = _host_env(**{LINK_ENV: describe_emulated(rate_mbit), RATE_ENV: f"{rate_mbit:g}"})
    rc0 = _on_two_hosts(f"arm {arm}", lambda rank, addr0: machine_rank_command(study, arm, rank, addr0), env,
                        rate_mbit, flow_mbit, timeout_s, meanwhile=meanwhile,
                        before_host_1=lambda p0: _wait_for_claim(study, arm, p0, timeout_s))
    return rc0 == 0
