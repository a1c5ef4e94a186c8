"""The arms' sockets between hosts: a plan's `TxS` setting as the environment NCCL or gloo read.

    env_for("4x4", "nccl")             # NCCL_SOCKET_NTHREADS=4, NCCL_NSOCKS_PERTHREAD=4: 16 flows a peer
    env_for("2x2", "gloo", "gslink")   # GLOO_SOCKET_IFNAME=gslink,gslink,gslink,gslink: 4 devices

A cloud network caps each TCP flow between instances (AWS: 5 Gbit/s outside a cluster placement
group, and the study's two hosts are in two zones, so they can share none): a collective over
one socket gets one flow's rate, over several up to the host's. NCCL's socket transport opens T
threads of S sockets to each peer (T x S at most 64). Gloo has no such setting; it opens one
connection per device, and a process group given the same interface T x S times has that many
devices, which it uses in turn for the collectives in flight (DDP's buckets), so several
buckets go out on several flows.
"""
from __future__ import annotations

import ipaddress
import os

from gradshare.contract.hosts_plan import socket_counts

ENV_NAMES = ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def backend(plan) -> str:
    """The arms' backend: NCCL between GPUs, gloo on CPUs and in the one-GPU rehearsal."""
    return "nccl" if plan.hardware.device == "cuda" and not plan.hardware.rehearsal else "gloo"


def interface(plan, main_ip: str, env=None) -> str:
    """The interface the sockets go out on: the plan's, the environment's (gloo's first name),
    loopback for a study on one host; else "" (the library chooses)."""
    env = os.environ if env is None else env
    if plan.hardware.socket_ifname:
        return plan.hardware.socket_ifname
    named = env.get("GLOO_SOCKET_IFNAME", "").split(",")[0] or env.get("NCCL_SOCKET_IFNAME", "")
    if named:
        return named
    try:
        return "lo" if ipaddress.ip_address(main_ip).is_loopback else ""
    except ValueError:
        return ""


def env_for(setting: str, kind: str, ifname: str = "") -> dict[str, str]:
    """The environment of a setting `TxS` for backend `kind` (`nccl`, `gloo`)."""
    counts = socket_counts(setting)
    if counts is None:
        raise ValueError(f"socket setting {setting!r} is not TxS (T x S <= 64)")
    threads, per_thread = counts
    if kind == "nccl":
        return {"NCCL_SOCKET_NTHREADS": str(threads), "NCCL_NSOCKS_PERTHREAD": str(per_thread)} | (
            {"NCCL_SOCKET_IFNAME": ifname} if ifname else {})
    return {"GLOO_SOCKET_IFNAME": ",".join([ifname] * (threads * per_thread))} if ifname else {}


def seen(env=None) -> str:
    """The socket settings in this process's environment, as a run records them."""
    env = os.environ if env is None else env
    return ";".join(f"{k}={env[k]}" for k in ENV_NAMES if env.get(k)) or "(libraries' defaults)"
