"""Seconds of one update on one GPU, in parts that scale with what each part is bound by.

    t(rank) = a x padded tokens          matrix work (forward and backward), bound by bf16 matrix rate
            + b x micro-batches          each micro-batch's gradient added into the gradients: memory-bound
            + c                          clip, AdamW, zeroing, over every parameter: memory-bound
            + x(arm)                     dense: the exchange pass's additions and DDP's bucket work, memory-bound;
                                         powersgd: x(dense) + compression (memory-bound) + the FP32 host
                                         error's copies up and down, 2 x error bytes / the pinned
                                         copy rate both ways at once, bound by the host link

The parts are measured on one GPU (`Calibration`, from `benchmarks/calibrate_projection.py`
over a `benchmarks/gpu_path.py` result file): b and c from the profiled update's memory-bound
kernels, a and the arms' extras from one workload's medians; the other workload checks them.
Then each part is scaled to another GPU by the rate it is bound by (`scaled_to`): the matrix
part by bf16 matrix rates, the memory-bound parts by memory bandwidths, the copies by the host
link's pinned rate. Where a copy of the error could hide behind compute it is not counted as
hidden: the exchange runs after the micro-batches, and what the micro-batches overlap (the
staging budget's worth, ~0.4 GB of 6.9) is inside the measured extra already.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gradshare.cost.volume import GB

CALIBRATION = Path(__file__).parent / "calibration" / "gpu_cost_h200.json"


@dataclass(frozen=True)
class GpuRates:
    name: str
    matmul_tflops: float
    """bf16 dense matrix rate."""
    memory_gbps: float
    """Device memory bandwidth."""
    pinned_both_gbps: float
    """Pinned host <-> device copies, both directions at once, GB/s together."""
    source: str
    """Measured (where, when, which commit) or declared (and from what)."""


@dataclass(frozen=True)
class Calibration:
    gpu: GpuRates
    s_per_padded_token: float
    s_per_micro_batch: float
    s_fixed: float
    dense_extra_s: float
    compress_s: float
    """powersgd's own seconds beyond dense and beyond the error's copies."""
    error_bytes: float
    """The FP32 host error: 4 bytes per parameter, up and down every compressed update."""
    source: str
    checks: dict
    """Predicted against measured on the workload the parts were not fitted on."""

    def copies_s(self) -> float:
        return 2 * self.error_bytes / (self.gpu.pinned_both_gbps * GB)

    def parts(self, arm, padded_tokens: float, micro_batches: float, update: int | None = None) -> dict[str, float]:
        """One rank's update of `arm` (`Plan.arm(name)`), in parts (seconds): a compressed update
        of a PowerSGD arm, or where `update` is given, that update (its warm-up a plain all-reduce).
        The compression's seconds are the calibration's, measured at the study's rank (32), for
        every rank."""
        out = {"matrix": self.s_per_padded_token * padded_tokens, "micro_batches": self.s_per_micro_batch * micro_batches,
               "fixed": self.s_fixed}
        if arm.is_ddp:
            out["dense_extra"] = self.dense_extra_s
        if arm.has_powersgd and (update is None or arm.compresses(update)):
            out["compress"] = self.compress_s
            out["error_copies"] = self.copies_s()
        return out

    def seconds(self, arm, padded_tokens: float, micro_batches: float, update: int | None = None) -> float:
        return sum(self.parts(arm, padded_tokens, micro_batches, update).values())

    def scaled_to(self, target: GpuRates) -> "Calibration":
        """The same parts on `target`: each scaled by the rate it is bound by."""
        matrix = self.gpu.matmul_tflops / target.matmul_tflops
        memory = self.gpu.memory_gbps / target.memory_gbps
        return replace(self, gpu=target, s_per_padded_token=self.s_per_padded_token * matrix,
                       s_per_micro_batch=self.s_per_micro_batch * memory, s_fixed=self.s_fixed * memory,
                       dense_extra_s=self.dense_extra_s * memory, compress_s=self.compress_s * memory,
                       source=f"{self.source}; scaled to {target.name}: matrix x {matrix:.2f}, memory-bound x "
                              f"{memory:.2f}, error copies at {target.pinned_both_gbps:g} GB/s both ways")

    def to_dict(self) -> dict:
        return asdict(self)


def load(path: Path = CALIBRATION) -> Calibration:
    raw = json.loads(Path(path).read_text())
    return Calibration(**{**raw, "gpu": GpuRates(**raw["gpu"])})


def declared_gpu(plan) -> GpuRates:
    """The study's hosts' GPU from the plan's declared figures (`infra.gpu_*`, with their sources)."""
    i = plan.infra
    return GpuRates(name=i.gpu, matmul_tflops=i.gpu_dense_tflops, memory_gbps=i.gpu_memory_gbps,
                    pinned_both_gbps=i.host_pinned_both_gbps,
                    source=f"declared in the plan: infra.gpu_dense_tflops {i.gpu_dense_tflops:g}, "
                           f"infra.gpu_memory_gbps {i.gpu_memory_gbps:g}, infra.host_pinned_both_gbps "
                           f"{i.host_pinned_both_gbps:g}")
