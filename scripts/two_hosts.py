"""Two emulated hosts on this machine (root, `ip`, `tc`): see `gradshare/hosts/netns.py`.

    # hold two hosts until Ctrl-C, with the tracking server at 127.0.0.1:5000 reachable from both
    sudo python scripts/two_hosts.py up --rate-mbit 22 --bridge-port 5000
    # one arm of a prepared study across two fresh hosts (link rate from the study's plan), each
    # machine rank started with `mlflow run`; then tear down. The tracking store: a SQLite file, or
    # a server on this machine's 127.0.0.1 (both hosts reach it through a bridge)
    sudo python scripts/two_hosts.py run --study S --arm dense
    # remove what an interrupted use left behind (namespaces whose maker is gone)
    sudo python scripts/two_hosts.py down

The link carries 198.18.0.1 (host 0) <-> 198.18.0.2 (host 1) only; latency is not emulated.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gradshare.hosts import netns  # noqa: E402
from gradshare.contract.hosts_plan import LinkPlan  # noqa: E402
from gradshare.contract.tags import FAILURE  # noqa: E402


def _need_hosts() -> None:
    reason = netns.unavailable()
    if reason:
        raise SystemExit(f"two_hosts: cannot make emulated hosts here: {reason}")


def _train_cmd(hosts, rank: int, study: str, arm: str, port: int) -> list[str]:
    from gradshare.steps.emulated import machine_rank_command

    return hosts.host(rank) + machine_rank_command(study, arm, rank, hosts.addr[0], port)


def up(args) -> None:
    _need_hosts()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with netns.two_hosts(args.rate_mbit) as hosts:
        if args.bridge_port:
            hosts.bridge(args.bridge_port)
        env = " ".join(f"{k}={v}" for k, v in hosts.env.items())
        print(f"host 0: namespace {hosts.ns[0]}, {hosts.addr[0]}; host 1: namespace {hosts.ns[1]}, "
              f"{hosts.addr[1]}; link {args.rate_mbit:g} Mbit/s each way (tc tbf), no latency emulated")
        if args.bridge_port:
            print(f"127.0.0.1:{args.bridge_port} on both hosts reaches 127.0.0.1:{args.bridge_port} here")
        for rank in (0, 1):
            print(f"machine rank {rank}:  {env} " + " ".join(_train_cmd(hosts, rank, "STUDY", "dense", 29500)))
        print("Ctrl-C tears everything down.", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    print("torn down")


def run(args) -> None:
    _need_hosts()
    from gradshare.tracking import store
    from gradshare.steps.emulated import choose_link, run_arm_across

    _, plan = store.prepared_plan(args.study)
    link = choose_link("emulated", plan)  # refuses with the reason (a tracking server it cannot reach)
    print(f"[two_hosts] arm {args.arm}: {link.note}", flush=True)
    ok = run_arm_across(args.study, args.arm, plan.link.rate_mbit,
                        plan.arms.timeout_s(plan.schedule.updates) + 300)
    if not ok:
        raise SystemExit(f"two_hosts run: arm {args.arm} ended FAILED: see its run's {FAILURE}")


def down(args) -> None:
    _need_hosts()
    left = netns.leftovers(stale=not args.all)
    for name in left:
        netns._kill_inside(name)
        subprocess.run(["ip", "netns", "del", name], check=False)
    print(f"removed {len(left)} namespace(s): {' '.join(left) or '-'}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="make two hosts and hold them until Ctrl-C")
    p.add_argument("--rate-mbit", type=float, default=LinkPlan().rate_mbit)
    p.add_argument("--bridge-port", type=int, default=0, help="tracking server port to reach from both hosts")
    p.set_defaults(fn=up)
    p = sub.add_parser("run", help="one arm of a prepared study across two fresh hosts")
    p.add_argument("--study", required=True)
    p.add_argument("--arm", required=True, help="a two-process arm of the study's plan (dense, powersgd, ...)")
    p.set_defaults(fn=run)
    p = sub.add_parser("down", help="remove the namespaces of gradshare users that are gone")
    p.add_argument("--all", action="store_true", help="also those of running users (their runs break)")
    p.set_defaults(fn=down)
    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
