"""One update of an arm's own run, profiled: where a production arm spends what the benchmark
harness does not (a developer's switch, read here only):

    GRADSHARE_PROFILE_UPDATE=U   each rank profiles update U (torch.profiler: host and device)
                                 into profile.rank<R>.txt in the arm's working directory; rank 0
                                 logs its table as the run's artifact profile/profile.rank0.txt

`benchmarks/rehearsal.py --profile-update U` sets it for the `single` arm, beside the harness's
profile of the same workload (`benchmarks/gpu_path.py`).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "GRADSHARE_PROFILE_UPDATE"


@dataclass(frozen=True)
class ProfileRequest:
    update: int
    """The update to profile (1-based)."""
    out: Path
    """The table's file."""


def from_env(workdir: Path, rank: int, env=None) -> ProfileRequest | None:
    value = (os.environ if env is None else env).get(ENV, "").strip()
    if not value:
        return None
    try:
        update = int(value)
    except ValueError:
        raise ValueError(f"{ENV}={value!r} must be an update number (1-based); unset it to train "
                         f"without a profile") from None
    return ProfileRequest(update, Path(workdir) / f"profile.rank{rank}.txt")


@contextlib.contextmanager
def profiled(request: ProfileRequest | None, update: int, device: torch.device):
    """Profile the body where `request` asks for this update; else nothing."""
    if request is None or request.update != update:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield
    avg = prof.key_averages()
    host = sum(e.self_cpu_time_total for e in avg) / 1e6
    dev = sum(getattr(e, "self_device_time_total", 0) for e in avg) / 1e6
    by = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    request.out.write_text(f"update {update}: host self time {host:.3f} s, device self time {dev:.3f} s\n\n"
                           f"by {by}:\n{avg.table(sort_by=by, row_limit=40)}\n\n"
                           f"by self_cpu_time_total:\n{avg.table(sort_by='self_cpu_time_total', row_limit=25)}\n")
