"""Seconds of one update on one GPU, in parts that scale with what each part is bound by.

    t(rank) = a x padded tokens          matrix work (forward and backward), bound by bf16 matrix rate
            + b x micro-batches          each micro-batch's gradient added into the gradients: memory-bound
            + c                          clip, AdamW, zeroing, over every parameter: memory-bound
            + x(arm)                     its kind's (`ArmKind.cost_parts`); dense: the exchange pass's additions and DDP's bucket work, memory-bound;
                                         powersgd: x(dense) + compression + the FP32 host error's exposed copies

PowerSGD's parts, per compressed update of one rank:

    compression     the profiled compression's GPU time at the calibration's rank, plus a slope per unit
                    of rank where two ranks were measured (`compress_s_per_rank`); memory-bound
    copies          2 x error bytes / the pinned rate both ways at once: the error up and down
    covered         the compute the copies run beside: the micro-batches' (a + b parts), as far as the
                    staging lets the error up during them (one staging's worth per micro-batch, at
                    half the both-ways rate: one direction), plus the compression, which the last
                    copies down run beside; only for a calibration measured on the hook that folds
                    (`copy_overlap`), else none
    exposed         max(0, copies - covered): the part that adds to the update

The parts are measured on one GPU (`Calibration`, from `benchmarks/calibrate_projection.py`
over a `benchmarks/gpu_path.py` result file): b and c from the profiled update's memory-bound
kernels, the compression from the profiled PowerSGD update's own range, a and dense's extra
from one workload's medians; every arm is then predicted on both workloads (the checks).
Each part is scaled to another GPU by the rate it is bound by (`scaled_to`): the matrix part by
bf16 matrix rates, the memory-bound parts by memory bandwidths, the copies by the host link's
pinned rate.
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
    """PowerSGD's compression at `compress_rank`: the profiled update's GPU time for it."""
    error_bytes: float
    """The FP32 host error: 4 bytes per parameter, up and down every compressed update."""
    source: str
    checks: dict
    """Predicted against measured, every arm on both workloads."""
    copy_overlap: str = "none"
    """How the measured hook moved the error: `fold` (the fast hook with `powersgd.fold_errors`: up
    during the micro-batches, one staging's worth each, folded into the gradients) or `none` (each
    bucket's error in its own call, in the exchange: no copy is counted as covered)."""
    compress_rank: int = 32
    compress_s_per_rank: float = 0.0
    """Compression's seconds per unit of rank, where two ranks were measured; 0: one rank only."""

    def copies_s(self) -> float:
        """The error up and down, both directions at once."""
        return 2 * self.error_bytes / (self.gpu.pinned_both_gbps * GB)

    def compression_s(self, rank: int) -> float:
        return max(0.0, self.compress_s + self.compress_s_per_rank * (rank - self.compress_rank))

    def copies(self, arm, padded_tokens: float, micro_batches: float, staging_bytes: float) -> dict[str, float]:
        """A compressed update's copies of the error: their seconds, the compute that covers them
        and what is left exposed (the module's docstring)."""
        copies = self.copies_s()
        if self.copy_overlap != "fold":  # measured on a hook that hides nothing: the copies count whole
            return {"copies_s": copies, "covered_s": 0.0, "exposed_s": copies}
        compute = self.s_per_padded_token * padded_tokens + self.s_per_micro_batch * micro_batches
        one_way = self.gpu.pinned_both_gbps * GB / 2
        during = min(self.error_bytes, staging_bytes * micro_batches) / one_way
        covered = min(compute, during) + self.compression_s(arm.rank)
        return {"copies_s": copies, "covered_s": covered, "exposed_s": max(0.0, copies - covered)}

    def parts(self, arm, plan, padded_tokens: float, micro_batches: float,
              update: int | None = None) -> dict[str, float]:
        """One rank's update of `arm` (`Plan.arm(name)`) under `plan`, in parts (seconds): the
        compute every arm does, and its kind's own parts (`ArmKind.cost_parts`): a compressed
        update of a compressing arm, or where `update` is given, that update (a warm-up exchanges
        plainly)."""
        out = {"matrix": self.s_per_padded_token * padded_tokens, "micro_batches": self.s_per_micro_batch * micro_batches,
               "fixed": self.s_fixed}
        return out | arm.method.cost_parts(self, arm, plan, padded_tokens, micro_batches, update)

    def seconds(self, arm, plan, padded_tokens: float, micro_batches: float, update: int | None = None) -> float:
        return sum(self.parts(arm, plan, padded_tokens, micro_batches, update).values())

    def scaled_to(self, target: GpuRates) -> "Calibration":
        """The same parts on `target`: each scaled by the rate it is bound by."""
        matrix = self.gpu.matmul_tflops / target.matmul_tflops
        memory = self.gpu.memory_gbps / target.memory_gbps
        return replace(self, gpu=target, s_per_padded_token=self.s_per_padded_token * matrix,
                       s_per_micro_batch=self.s_per_micro_batch * memory, s_fixed=self.s_fixed * memory,
                       dense_extra_s=self.dense_extra_s * memory, compress_s=self.compress_s * memory,
                       compress_s_per_rank=self.compress_s_per_rank * memory,
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
