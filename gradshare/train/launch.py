"""The launch parameters of a train step, checked before anything runs.

    mlflow run . -e train --env-manager local -P arm=dense -P machine_rank=-1   # one line, no run
    python -m entrypoints.train --study S --arm dense --machine-rank -1        # usage and one line

One function, asked by the `mlflow run` plugin (before MLflow creates a run) and by the
train entry point (before it opens one): the first parameter that cannot work, named
with the values it may take. `driver.check_launch` asks it again inside the arm's run,
for any caller that reaches the driver another way.
"""
from __future__ import annotations

from collections.abc import Mapping

# The launch parameters, as the MLproject and `-P` name them (`--num-machines` as flags).
LAUNCH_PARAMS = ("num_machines", "machine_rank", "main_process_port", "full_state_every")


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
