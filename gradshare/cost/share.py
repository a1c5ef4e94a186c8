"""One rank's share of an update: the one home of the figure that the projections multiply one
device's whole update (a one-process arm's) by, for an arm of several processes.

    compute share(arm) = 1                        a one-process arm
                       = the preflight's share    where a preflight timed it on these hosts with as
                                                  many ranks (`gradshare.hosts.probe.compute_share`)
                       = 1 / processes            else: a rank's documents, on a device of its own

On two real hosts each rank computes on a device of its own: about 1/2 (a little more, as the
clip and the optimizer's step are whole on every rank). On emulated hosts the ranks share one
machine's cores, and a rank's half of the documents can take as long as the whole update does
alone: only a measurement on the hosts says which.
"""
from __future__ import annotations


def work_share(processes: int) -> float:
    """A rank's documents of an update: 1/processes (each rank trains its part of every update)."""
    if processes < 1:
        raise ValueError(f"an arm has at least one process, not {processes}")
    return 1.0 / processes


def compute_share(plan, arm: str, figures: dict | None = None) -> tuple[float, str]:
    """(one rank's share of `arm`'s update, where it comes from): measured by the preflight in
    `figures` for an arm of as many processes as it probed, else the rank's documents."""
    processes = plan.arms.processes(arm)
    if processes == 1:
        return 1.0, "one process: the whole update"
    timed = (figures or {}).get("compute") or {}
    if timed.get("share") and figures.get("world") == processes:
        return timed["share"], f"the preflight's ({timed.get('source', 'measured')})"
    return work_share(processes), f"a rank's documents, 1/{processes} (no preflight timed the hosts)"
