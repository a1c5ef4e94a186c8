"""The table of arm kinds: every kind a row of `arms.rows` may name, in one place.

    from gradshare.kinds import table
    table.of("powersgd").describe(arm)   # the kind's words; table.of("topk") raises UnknownKind

A new kind is one module of `gradshare.kinds` (an `ArmKind`) and its line here.
"""
from __future__ import annotations

from gradshare.kinds.base import ArmKind, UnknownKind
from gradshare.kinds.dense import Dense
from gradshare.kinds.fp16 import FP16
from gradshare.kinds.powersgd import PowerSGD
from gradshare.kinds.single import Single

KINDS: dict[str, ArmKind] = {k.name: k for k in (Single(), Dense(), PowerSGD(), FP16())}


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def of(name: str) -> ArmKind:
    """The kind called `name`; UnknownKind naming the known ones where the table has none."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise UnknownKind(f"kind {name!r} is not one of {', '.join(KINDS)}") from None
