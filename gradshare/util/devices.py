"""A process's device, always with its index: the one form every `torch.cuda` call accepts.

accelerate's `Accelerator().device` in a one-process launch is `cuda`, with no index, and so is
`torch.device("cuda")`. Some `torch.cuda` calls take it (they fall back to the current device),
others refuse it: `set_per_process_memory_fraction` and `set_device` raise "Expected a
torch.device with a specified index". A refused call on the GPU path fails the arm at start-up
on every CUDA machine, a failure no CPU run meets (2026-12-06: every one-process arm). So each
process resolves its device once, here, wherever it came from (accelerate, the one-GPU
rehearsal, a plan), and passes only the indexed form on.
"""
from __future__ import annotations

import torch


def indexed(device: torch.device | str) -> torch.device:
    """`device` with its index: `cuda` becomes `cuda:<the current device>`; `cuda:N` and `cpu`
    stay as they are."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
