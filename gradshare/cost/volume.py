"""What an exchange puts on the wire: one formula for each quantity, used by the loop's metering,
the budget check, the cost table and the projection alike.

    exchange_bytes(plan, shapes).of(plan.arm("powersgd"), u)  # one rank's payload at update u
    logical_bytes_per_exchange(shapes, 4, rank)  # one rank's payload handed to one all-reduce
    wire_bytes_per_rank(logical, world)          # what a ring all-reduce sends (and receives) per rank
    cross_zone_bytes(logical, world)             # sent plus received by every host, hosts in two zones

A ring all-reduce of B logical bytes over W ranks sends 2(W-1)/W x B per rank and receives as
much; on TCP/IP over Ethernet each 1,448 bytes of payload take 1,514 on the wire at MTU 1500
(Ethernet 14 + IP 20 + TCP with timestamps 32 bytes of headers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

GRADIENT_BYTES = 4  # every arm exchanges FP32 gradients (PowerSGD: FP32 P and Q)
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


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> tuple[bool, int, int]:
    """Upstream `powerSGD_hook._should_compress`, the same rule (tested against it) without
    importing torch: the launcher and the budget check load none. (compress?, numel before, after)"""
    uncompressed, compressed = rows * cols, (rows + cols) * rank
    return compressed * min_compression_rate < uncompressed, uncompressed, compressed


def logical_bytes_per_exchange(param_shapes: list[tuple[int, ...]], element_bytes: int,
                               rank: int | None, min_compression_rate: float = 2.0) -> int:
    """Logical (tensor-payload) bytes one rank contributes to one gradient exchange.

    This is the volume upstream PowerSGD work quotes: elements handed to all-reduce times
    `element_bytes`. It excludes protocol overhead and the all-reduce algorithm's own
    factor (a ring all-reduce moves about 2(W-1)/W times this over each link).

    `rank=None` is the dense all-reduce. Otherwise the per-tensor rule is upstream
    `powerSGD_hook`'s, for every `min_compression_rate`: EVERY gradient, whatever its
    ndim, is viewed as `tensor.view(tensor.shape[0], -1)`, an n x m matrix with
    m = numel / n (a 1-D tensor of n elements is n x 1, a conv weight (o, i, kh, kw) is
    o x (i*kh*kw)); r = min(n, m, rank); and `_should_compress(n, m, r, rate)` decides.
    A compressed tensor contributes its P and Q, n*r + m*r elements, an uncompressed one
    its n*m elements; these are the amounts upstream adds to its own counter
    `total_numel_after_compression`. So a 1-D tensor (bias, norm) of n elements is
    compressed, into n + 1 elements (more than n), iff (n + 1) * rate < n: with a rate
    below 1 once n is large enough (rate 0.5: n >= 2), with a rate >= 1 never.

    Zero-size tensors: a shape (n, 0, ...) with n > 0 is n x 0, r = 0, not compressed,
    0 elements, as upstream. Upstream's hook cannot handle a 0-dim tensor (`shape[0]`
    raises IndexError) or a leading size of 0 (`view(0, -1)` raises RuntimeError), so a
    PowerSGD run with such a parameter would fail at its first compressed exchange; here
    such shapes count as their numel (1 and 0), uncompressed, so that the count stays
    defined for the other arms, which share this accounting.
    """
    elements = 0
    for shape in param_shapes:
        numel = 1
        for size in shape:
            numel *= size
        if rank is None or len(shape) == 0 or shape[0] == 0:
            elements += numel
            continue
        n = shape[0]
        m = numel // n
        r = min(n, m, rank)
        compress, uncompressed, compressed = should_compress(n, m, r, min_compression_rate)
        elements += compressed if compress else uncompressed
    return elements * element_bytes


@dataclass(frozen=True)
class ExchangeBytes:
    """One rank's logical bytes per exchange of the plan's model: the whole gradient (`dense`), and
    PowerSGD's P and Q with the tensors it leaves uncompressed, at the plan's `powersgd.rank`
    (`compressed`) and at every rank an arm of the plan uses (`by_rank`)."""
    dense: int
    compressed: int
    by_rank: dict[int, int] = field(default_factory=dict)

    def of(self, arm, update: int) -> int:
        """What `arm` (`Plan.arm(name)`) exchanges at `update` (1-based): nothing in one process,
        P and Q at its rank once PowerSGD compresses, the whole gradient otherwise (its warm-up
        included)."""
        if not arm.is_ddp:
            return 0
        return self.by_rank[arm.rank] if arm.compresses(update) else self.dense


def exchange_bytes(plan, param_shapes: list[tuple[int, ...]]) -> ExchangeBytes:
    """The bytes per update of every arm of `plan` (each PowerSGD arm's rank, the plan's compression
    rule) for a model of `param_shapes`: the one figure the loop meters, the budget bills and the
    projection sends."""
    p = plan.powersgd
    ranks = {p.rank} | {a.rank for a in plan.arm_list() if a.has_powersgd}
    by_rank = {r: logical_bytes_per_exchange(param_shapes, GRADIENT_BYTES, r, p.min_compression_rate) for r in ranks}
    return ExchangeBytes(dense=logical_bytes_per_exchange(param_shapes, GRADIENT_BYTES, None),
                         compressed=by_rank[p.rank], by_rank=by_rank)


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
