"""The train step's refusals before an attempt is claimed: what the caller or the machine got
wrong, found before anything trains, so that it costs the arm no attempt (the run is tagged a
refusal). An arm that is not a row of the plan, a host without the devices the arm needs, train
inputs whose bytes differ from prepare's manifest, an outbox or working directory that could not
keep the arm's result.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.plan import Plan
from gradshare.tracking import figures as study_figures
from gradshare.tracking import outbox, store
from gradshare.train import workdir as workdir_files
from gradshare.train.launch import Launch


def check_arm(plan: Plan, arm: str) -> None:
    """Refuse an arm that is not a row of the study's plan (`arms.rows`), naming its arms."""
    if arm not in plan.arms.names:
        raise Refusal(f"arm {arm!r} is not an arm of the study's plan: choose one of {', '.join(plan.arms.names)}")


def check_devices(plan: Plan, arm: str, launch: Launch) -> None:
    """Refuse a CUDA arm on a host with fewer GPUs than its share of the arm's processes, naming
    what it needs and where it could run."""
    need = plan.arms.processes(arm)
    if plan.hardware.device != "cuda":
        return
    import torch  # here, not above: on CPU the driver never loads torch (about 2 s per arm)

    if need % launch.num_machines:
        raise Refusal(f"arm {arm} needs {need} GPUs, which do not split over "
                        f"{launch.num_machines} machines")
    # a rehearsal puts every process of the arm on the one GPU (`hardware.rehearsal`)
    per_host = 1 if plan.hardware.rehearsal else need // launch.num_machines
    have = torch.cuda.device_count()
    if have < per_host:
        where = "a machine with a CUDA GPU" if per_host == 1 else f"a host with {per_host} CUDA GPUs"
        hint = f"run it on {where}"
        if need > 1 and launch.num_machines == 1:
            hint += (", or on two hosts with one GPU each (-P num_machines=2 -P machine_rank=0|1 "
                     "-P main_process_ip=HOST on both)")
        raise Refusal(f"arm {arm} needs {need} CUDA device(s), {per_host} on this host, and this host has "
                        f"{have}: {hint}; nothing was trained, no attempt used")


def verified_workdir(prep, plan: Plan, tmp: Path) -> Path:
    """The train inputs, every byte checked against prepare's manifest; a mismatch is a refusal
    (the store's fault, not the method's: the arm keeps its attempt, and trains once fixed)."""
    try:
        workdir = store.verified_inputs(prep, plan, tmp, store.TRAIN_INPUTS)
    except StudyError as exc:
        raise Refusal(f"{exc}; nothing was trained, no attempt used") from None
    workdir_files.write_plan(workdir, plan)
    return workdir


def check_disks(prep, plan: Plan, workdir: Path) -> None:
    """A refusal, before the claim, where the arm could not keep its result: the outbox (where
    rank 0 writes the final checkpoint, `train.result`) or the working directory not writable,
    or the outbox's disk without room for the checkpoint."""
    box_root = outbox.root()
    for where, path in (("the outbox ($GRADSHARE_OUTBOX)", box_root), ("the arm's working directory", workdir)):
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".gradshare-write-check-{os.getpid()}"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as exc:
            raise Refusal(f"{where} {path} is not writable ({exc.strerror or exc}): the arm could not keep "
                            f"its checkpoint; nothing was trained, no attempt used") from None
    need, free = checkpoint_bytes(prep, plan), shutil.disk_usage(box_root).free
    if free < need:
        raise Refusal(f"the disk of the outbox {box_root} has {free:,} bytes free, and the arm's final "
                        f"checkpoint needs {need:,}: free space or point $GRADSHARE_OUTBOX at a larger disk; "
                        f"nothing was trained, no attempt used")


def checkpoint_bytes(prep, plan: Plan) -> int:
    """What the arm's final checkpoint will take on disk: its FP32 weights, by the parameter
    shapes prepare recorded (`model_shapes.json`), plus 5% and 64 MiB for the config, the
    tokenizer and the file system's slack."""

    weights = sum(math.prod(s) for s in study_figures.prepared_shapes(prep, plan)) * 4
    return int(weights * 1.05) + 64 * 2**20
