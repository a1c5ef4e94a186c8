"""Two real gloo ranks on this machine for the PowerSGD tests: each runs `worker(rank, port,
out_dir)` and saves `rank<N>.pt` there; the results come back in rank order."""
from __future__ import annotations

import importlib
import os
import time

import pytest
import torch
import torch.multiprocessing as mp

from gradshare.train.launch import free_port


def run_two_ranks(worker, out_dir, world: int, what: str, limit_s: float = 120) -> list:
    # fork, after importing what DDP() imports lazily (torch._dynamo, seconds per process),
    # so the ranks start in milliseconds. Where a GPU is present the parent holds driver
    # threads, and forked ranks died on the H200 image (torch 2.11): spawn there.
    importlib.import_module("torch._dynamo")
    method = os.environ.get("GRADSHARE_TEST_START_METHOD") or ("spawn" if torch.cuda.is_available() else "fork")
    ctx = mp.start_processes(worker, args=(free_port(), str(out_dir)), nprocs=world, join=False,
                             start_method=method)
    deadline = time.monotonic() + limit_s
    try:
        while not ctx.join(timeout=1):  # raises if a rank failed
            if time.monotonic() > deadline:
                pytest.fail(f"two-rank {what} run timed out")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    return [torch.load(f"{out_dir}/rank{r}.pt") for r in range(world)]
