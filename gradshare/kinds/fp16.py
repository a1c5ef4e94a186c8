"""`fp16`: DDP with PyTorch's own `fp16_compress_hook`: each bucket cast to FP16 (divided by the
world first), all-reduced, cast back; half the dense payload, from the first update, no state.

PyTorch's `bf16_compress_hook` is the same hook in bfloat16, but it refuses any backend but NCCL
(2.10+) or XCCL ("BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+"), so it
could not run where the study's tests run (gloo on a CPU). FP16 keeps 10 bits of mantissa to
BF16's 7 and overflows above 65,504: a gradient that large would reach AdamW as infinite, and
the loop ends the arm as diverged.

    arms.rows = single:single:1,dense:dense:2,powersgd:powersgd:2,fp16:fp16:2
"""
from __future__ import annotations

from gradshare.kinds.base import ArmKind, ExchangeHook

HALF = 2 / 4  # FP16 over FP32 bytes per gradient element


class FP16(ArmKind):
    name = "fp16"
    compresses_gradient = True
    words = "DDP with PyTorch's fp16_compress_hook (the gradient in FP16 on the wire)"

    def compresses(self, arm, update):
        return True

    def payload(self, arm, plan, shapes):
        dense, _ = super().payload(arm, plan, shapes)
        return int(dense * HALF), int(dense * HALF)  # every update compresses: no plain one

    def _bytes_ratio(self):
        return HALF, HALF

    def attach(self, ddp, arm, plan, device, fresh):
        return _Hook(ddp)


class _Hook(ExchangeHook):
    def __init__(self, ddp):
        self.ddp = ddp

    def register(self) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
