"""What an exchange puts on the wire: one formula for each quantity, used by the loop's metering,
the budget check, the cost table and the projection alike.

    exchange_bytes(plan, shapes).of(plan.arm("powersgd"), u)  # one rank's payload at update u (its kind's count)
    wire_bytes_per_rank(logical, world)          # what a ring all-reduce sends (and receives) per rank
    cross_zone_bytes(logical, world)             # sent plus received by every host, hosts in two zones

A ring all-reduce of B logical bytes over W ranks sends 2(W-1)/W x B per rank and receives as
much; on TCP/IP over Ethernet each 1,448 bytes of payload take 1,514 on the wire at MTU 1500
(Ethernet 14 + IP 20 + TCP with timestamps 32 bytes of headers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gradshare.kinds.base import GRADIENT_BYTES, gradient_elements

WIRE_OVERHEAD = 1514 / 1448
GB = 1e9


def ring_factor(world: int) -> float:
    """Units of B a ring all-reduce sends per rank (and receives): 2(W-1)/W."""
    return 2 * (world - 1) / world if world > 1 else 0.0


def wire_bytes_per_rank(logical_bytes: float, world: int) -> float:
    """Bytes one rank sends (and as many it receives) on the wire for one all-reduce."""
    return logical_bytes * ring_factor(world) * WIRE_OVERHEAD


def cross_zone_bytes(logical_bytes: float, world: int) -> float:
    """Bytes every host together sends and receives for one all-reduce, where each ring hop joins
    two zones (the plan's hosts alternate between its two): what is billed, each direction."""
    return 2 * wire_bytes_per_rank(logical_bytes, world) * world


@dataclass(frozen=True)
class ExchangeBytes:
    """One rank's logical bytes per exchange of the plan's model, arm by arm as each arm's kind
    counts them (`ArmKind.payload`): in an update that does not compress and in one that does.
    `dense` is the whole FP32 gradient; `compressed`, the candidate's compressed payload."""
    dense: int
    compressed: int
    by_arm: dict[str, tuple[int, int]] = field(default_factory=dict)

    def of(self, arm, update: int) -> int:
        """What `arm` (`Plan.arm(name)`) exchanges at `update` (1-based), as its kind says: nothing
        in one process, its compressed payload once it compresses, the plain one before."""
        compresses = arm.compresses(update)  # its kind first: an unknown one is refused by name
        plain, compressed = self.by_arm[arm.name]
        return compressed if compresses else plain


def exchange_bytes(plan, param_shapes: list[tuple[int, ...]]) -> ExchangeBytes:
    """The bytes per update of every arm of `plan` for a model of `param_shapes`, each by its kind:
    the one figure the loop meters, the budget bills and the projection sends."""
    by_arm = {a.name: a.method.payload(a, plan, param_shapes) for a in plan.arm_list()}
    candidate = plan.arm(plan.arms.candidate)
    return ExchangeBytes(dense=gradient_elements(param_shapes) * GRADIENT_BYTES,
                         compressed=candidate.method.payload(candidate, plan, param_shapes)[1], by_arm=by_arm)


def crosses_zones(plan, arm: str) -> bool:
    """The arm's hosts sit in more than one zone: its exchanges are billed as cross-zone."""
    hosts = plan.arms.processes(arm)
    return hosts > 1 and len(set(plan.infra.zones[:hosts])) > 1


def arm_cross_zone_bytes(plan, arm: str, exchange: ExchangeBytes) -> float:
    """Cross-zone bytes, sent plus received, of all the arm's updates (0 where its hosts share a zone)."""
    if not crosses_zones(plan, arm):
        return 0.0
    kind = plan.arm(arm)
    return cross_zone_bytes(sum(exchange.of(kind, u) for u in range(1, plan.schedule.updates + 1)),
                            plan.arms.processes(arm))
