"""`single`: one process that makes the global batch by gradient accumulation, and exchanges
nothing: the study's reference for an update's compute and for the loss curve."""
from __future__ import annotations

from gradshare.kinds.base import ArmKind


class Single(ArmKind):
    name = "single"
    uses_ddp = False
    words = "none: the global batch by gradient accumulation on one device"

    def processes_problem(self, name, processes):
        if processes != 1:
            return (f"arms.rows: {name} is a single arm (one process that accumulates) but has "
                    f"{processes} processes; use kind dense for DDP")
        return None

    def link_round_s(self, arm, update, dense_round_s, compressed_round_s):
        return 0.0
