"""The study's cards, enforced on any card: PyTorch's allocator capped at `hardware.max_device_gib`.

The study's hosts carry one L40S 48 GB each; less the CUDA context, about 44 GiB is what an
arm may allocate there. Capped the same on a larger card (an H200's 139 GiB), an arm that would
not fit the study's hosts fails here too, FAILED with a reason that names the cap, the update
and what was being allocated, instead of passing on a benchmark machine and failing on the
rented hosts. The worker and the GPU benchmark call the same two functions.
"""
from __future__ import annotations

import re

import torch

from gradshare.util.devices import indexed

GIB = 2 ** 30


class DeviceMemoryError(RuntimeError):
    """Out of device memory; the message is the arm's failure reason (`out_of_memory_reason`)."""


def cap_device_memory(max_gib: float, device: torch.device) -> float | None:
    """Cap this process's allocator on `device` at `max_gib` GiB; returns the fraction of the
    card that is, or None where nothing is capped (0, or not a GPU)."""
    if max_gib <= 0 or device.type != "cuda":
        return None
    device = indexed(device)  # the fraction's call refuses a device without an index
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, max_gib * GIB / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _asked(message: str) -> str:
    m = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGT]?i?B)", message)
    return m.group(1) if m else "an amount the allocator did not say"


def out_of_memory_reason(exc: BaseException, max_gib: float, phase: str, device: torch.device) -> str:
    """One line for the run's failure reason: where (the update and its phase), what was being
    allocated, what was held, and the cap; the fix to try."""
    held = ""
    if device.type == "cuda":
        held = (f" with {torch.cuda.memory_allocated(device) / GIB:.1f} GiB allocated "
                f"(peak {torch.cuda.max_memory_allocated(device) / GIB:.1f} GiB)")
    cap = (f"under the plan's cap hardware.max_device_gib={max_gib:g} (an L40S 48 GB less the CUDA "
           f"context is 44)" if max_gib > 0 else "with no cap set (hardware.max_device_gib=0): the card's own memory")
    return (f"out of device memory in {phase}: tried to allocate {_asked(str(exc))}{held}, {cap}; "
            f"lower schedule.micro_batch_tokens (activations) or powersgd.staging_mb (the error in "
            f"flight), or run on a card with more memory and a higher cap")
