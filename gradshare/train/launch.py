"""How an arm's workers are launched: the launch parameters, checked before anything runs, and
the `accelerate launch` command and thread settings that start the workers.

    mlflow run . -e train --env-manager local -P arm=dense -P machine_rank=-1   # one line, no run
    python -m entrypoints.train --study S --arm dense --machine-rank -1        # usage and one line

`launch_problem` is asked by the `mlflow run` plugin (before MLflow creates a run) and by the
train entry point (before it opens one): the first parameter that cannot work, named with the
values it may take. `check_launch` asks it again inside the arm's run, for any caller that
reaches the driver another way. The preflight step starts its probes with the same command
pieces, so that they run as the arms run.
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gradshare.contract.errors import Refusal
from gradshare.contract.plan import Plan

# The launch parameters, as the MLproject and `-P` name them (`--num-machines` as flags).
LAUNCH_PARAMS = ("num_machines", "machine_rank", "main_process_port", "full_state_every")

# The module each rank runs (named from this package's own, so no module path is spelled out).
WORKER_MODULE = f"{__package__}.worker"


@dataclass(frozen=True)
class Launch:
    """Multi-node settings passed through to `accelerate launch` (one host by default)."""
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: int = 0  # 0: pick a free port (one host only)


def _int(value) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def launch_problem(values: Mapping[str, object]) -> tuple[str, str] | None:
    """The first launch parameter that cannot work, as (its name, a sentence naming it, its
    value and the values it may take); None if all can. `values` holds every name of
    `LAUNCH_PARAMS`: strings as `-P` passes them, or the entry point's parsed integers."""
    raw = {name: values[name] for name in LAUNCH_PARAMS}
    machines = _int(raw["num_machines"])
    if machines is None or machines < 1:
        return "num_machines", (f"num_machines={raw['num_machines']} is not a number of hosts: "
                                f"give an integer >= 1 (1: this host alone)")
    rank = _int(raw["machine_rank"])
    if rank is None or not 0 <= rank < machines:
        return "machine_rank", (f"machine_rank={raw['machine_rank']} is not a machine rank for "
                                f"num_machines={machines}: give an integer in 0..{machines - 1} "
                                f"(0: the host that holds the arm's run)")
    port = _int(raw["main_process_port"])
    if port is None or not 0 <= port <= 65535:
        return "main_process_port", (f"main_process_port={raw['main_process_port']} is not a port: "
                                     f"give an integer in 0..65535 (0: any free port, one host only)")
    if machines > 1 and port == 0:
        return "main_process_port", (f"main_process_port=0 (any free port) works on one host only: with "
                                     f"num_machines={machines} give every host the same port in 1..65535")
    every = _int(raw["full_state_every"])
    if every is None or every < 0:
        return "full_state_every", (f"full_state_every={raw['full_state_every']} is not a number of "
                                    f"updates: give an integer >= 1 (a full-state checkpoint every so "
                                    f"many updates), or 0 for none")
    return None


def check_launch(launch: Launch, full_state_every: int = 0) -> None:
    """The entry point's launch check (`launch_problem`), again inside the run, for any caller
    that reaches the driver another way."""

    values = {"num_machines": launch.num_machines, "machine_rank": launch.machine_rank,
              "main_process_port": launch.main_process_port, "full_state_every": full_state_every}
    if problem := launch_problem(values):
        raise Refusal(problem[1])


def free_port() -> int:
    """A loopback port nobody listens on now (for rendezvous, servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(plan: Plan, arm: str, workdir: Path, run_id: str, launch: Launch) -> list[str]:
    n = plan.arms.processes(arm)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n),
           "--num_machines", str(launch.num_machines), "--mixed_precision", "no",
           "--dynamo_backend", "no"]
    if n > 1:
        # `--cpu` with several processes starts one process; `--multi_gpu` plus
        # Accelerator(cpu=True) gives real gloo ranks on CPU.
        port = launch.main_process_port or free_port()
        cmd += ["--multi_gpu", "--machine_rank", str(launch.machine_rank),
                "--main_process_ip", launch.main_process_ip, "--main_process_port", str(port)]
    elif plan.hardware.device == "cpu":
        cmd += ["--cpu"]
    threads = plan.hardware.threads_per_process
    if threads > 0:  # every process of every arm the same: one device means the same in each arm
        cmd += ["--num_cpu_threads_per_process", str(threads)]
    elif n == 1 and plan.hardware.device == "cpu":
        cmd += ["--num_cpu_threads_per_process", str(os.cpu_count() or 1)]
    return cmd + ["-m", WORKER_MODULE, "--workdir", str(workdir), "--arm", arm,
                  "--run-id", run_id]


def thread_env(plan: Plan) -> dict[str, str]:
    """Thread-pool sizes for the workers' native libraries (accelerate sets only OMP's)."""
    n = plan.hardware.threads_per_process
    return {k: str(n) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")} if n > 0 else {}
