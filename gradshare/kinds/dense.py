"""`dense`: DDP with its own all-reduce of the whole FP32 gradient, once per update: the
uncompressed control. Everything it does is `ArmKind`'s default."""
from __future__ import annotations

from gradshare.kinds.base import ArmKind


class Dense(ArmKind):
    name = "dense"
    words = "DDP, plain all-reduce of the whole gradient"
