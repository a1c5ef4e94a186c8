"""`powersgd`: DDP with the PowerSGD communication hook (`gradshare.kinds.powersgd_hook`), its FP32
error feedback in host memory: the study's candidate.

It owns the plan's `powersgd` section (`PowerSGDPlan`), a row's `:rank=R` and `:warmup=W`,
upstream's rule for which matrices it compresses (`should_compress`), the payload of P and Q,
its compression and error copies in an update's cost, and its state in a full state.
"""
from __future__ import annotations

from dataclasses import dataclass

from gradshare.kinds.base import GRADIENT_BYTES, ArmKind, gradient_elements


@dataclass(frozen=True)
class PowerSGDPlan:
    rank: int = 32
    """Matrix approximation rank."""
    warmup_updates: int = 8
    """Plain all-reduce for updates 1..8; compression from update 9."""
    warm_start: bool = True
    """Reuse Q between updates."""
    error_feedback: str = "fp32-host"
    """`fp32-host`: FP32 error in (pinned) host memory, moved per bucket; `device`: upstream behaviour."""
    min_compression_rate: float = 2.0
    """Upstream rule: compress a matrix only if (rows+cols) x rank x rate < rows x cols."""
    bucket_cap_mb: int = 25
    """DDP bucket size."""
    hook: str = "upstream"
    """`upstream`: PyTorch's powerSGD_hook with the error staged around it; `fast`: gradshare's
    hook on the same PowerSGDState (one inline pass per bucket, orthogonalisation batched over
    same-shaped matrices, no device-wide sync, FP32 error moved on side streams)."""
    orthogonalization: str = "qr"
    """`qr` (upstream: Householder QR per matrix) or `cholesky-qr2` (batched Gram + Cholesky,
    twice; equals QR up to column signs for full-rank P, which P Q^T does not see). `fast` hook only."""
    staging_mb: int = 1024
    """`fast` hook: device memory the FP32 error may hold in flight to and from the host."""
    fold_errors: bool = False
    """`fast` hook: add each bucket's error into its gradients between the micro-batches (the error
    goes up beside them, one staging's worth per micro-batch), not in the exchange. The same sum in
    another order; off until measured on a GPU (BENCHMARKS.md)."""

    def problems(self, plan) -> list[str]:
        out = []
        if self.rank < 1:
            out.append("powersgd.rank must be >= 1")
        out += [f"powersgd.{line}" for line in warmup_problems(self, self.warmup_updates, plan.schedule.updates)]
        if self.error_feedback not in ("fp32-host", "device", "none"):
            out.append(f"powersgd.error_feedback={self.error_feedback!r} is not fp32-host, device or none")
        if self.hook not in ("upstream", "fast"):
            out.append(f"powersgd.hook={self.hook!r} is not upstream or fast")
        elif self.hook == "fast" and self.error_feedback != "fp32-host":
            out.append(f"powersgd.hook=fast keeps the error on the host: it needs "
                       f"powersgd.error_feedback=fp32-host, not {self.error_feedback!r}")
        if self.orthogonalization not in ("qr", "cholesky-qr2"):
            out.append(f"powersgd.orthogonalization={self.orthogonalization!r} is not qr or cholesky-qr2")
        elif self.orthogonalization != "qr" and self.hook != "fast":
            out.append("powersgd.orthogonalization=cholesky-qr2 needs powersgd.hook=fast")
        if self.staging_mb < 1 or self.bucket_cap_mb < 1:
            out.append("powersgd.staging_mb and powersgd.bucket_cap_mb must be >= 1")
        if self.fold_errors and self.hook != "fast":
            out.append("powersgd.fold_errors=true needs powersgd.hook=fast (upstream's hook adds the error itself)")
        return out

    def staging_bytes(self) -> float:
        """The staging that lets the error up during the micro-batches: the fast hook's, where it
        folds the error in (`fold_errors`); otherwise each bucket's error moves in its call."""
        return self.staging_mb * 2**20 if self.fold_errors else 0.0


def warmup_problems(p: PowerSGDPlan, warmup: int, updates: int) -> list[str]:
    """What is wrong with PowerSGD (`p`) warming up for `warmup` updates (the plan's, or one arm's
    own) in a schedule of `updates`."""
    out = []
    if (p.warm_start or p.error_feedback != "none") and warmup < 2:
        # Upstream: start_powerSGD_iter must be > 1 with error feedback or warm start, since
        # DDP rebuilds its buckets after the first exchange.
        out.append(f"warmup_updates={warmup} must be >= 2 when warm start or error feedback is on")
    if warmup >= updates:
        out.append(f"warmup_updates={warmup} leaves no compressed update within schedule.updates={updates}")
    return out


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> tuple[bool, int, int]:
    """Upstream `powerSGD_hook._should_compress`, the same rule (tested against it) without
    importing torch: the launcher and the budget check load none. (compress?, numel before, after)"""
    uncompressed, compressed = rows * cols, (rows + cols) * rank
    return compressed * min_compression_rate < uncompressed, uncompressed, compressed


def as_matrix(shape: tuple[int, ...], rank: int) -> tuple[int, int, int]:
    """Upstream's view of a gradient of `shape`: `tensor.view(shape[0], -1)`, an n x m matrix,
    at rank r = min(n, m, rank). (n, m, r)"""
    n = shape[0] if shape else 1
    numel = gradient_elements([shape])
    m = numel // n if n else 0
    return n, m, min(n, m, rank)


def compressed_elements(shapes, rank: int, min_compression_rate: float = 2.0) -> int:
    """Elements one rank hands to all-reduce in a compressed update: P and Q of every matrix
    upstream compresses, the whole of every other.

    The per-tensor rule is upstream `powerSGD_hook`'s, for every `min_compression_rate`: EVERY
    gradient, whatever its ndim, is viewed as an n x m matrix with m = numel / n (a 1-D tensor
    of n elements is n x 1, a conv weight (o, i, kh, kw) is o x (i*kh*kw)); r = min(n, m, rank);
    and `should_compress(n, m, r, rate)` decides. A compressed tensor contributes n*r + m*r
    elements, an uncompressed one n*m: the amounts upstream adds to its own counter
    `total_numel_after_compression`. So a 1-D tensor (bias, norm) of n elements is compressed,
    into n + 1 elements (more than n), iff (n + 1) * rate < n: with a rate below 1 once n is
    large enough (rate 0.5: n >= 2), with a rate >= 1 never.

    Zero-size tensors: a shape (n, 0, ...) with n > 0 is n x 0, r = 0, not compressed, 0
    elements, as upstream. Upstream's hook cannot handle a 0-dim tensor (`shape[0]` raises
    IndexError) or a leading size of 0 (`view(0, -1)` raises RuntimeError), so a PowerSGD run
    with such a parameter would fail at its first compressed exchange; here such shapes count
    as their numel (1 and 0), uncompressed, so that the count stays defined."""
    elements = 0
    for shape in shapes:
        if len(shape) == 0 or shape[0] == 0:
            elements += gradient_elements([shape])
            continue
        n, m, r = as_matrix(shape, rank)
        compress, uncompressed, compressed = should_compress(n, m, r, min_compression_rate)
        elements += compressed if compress else uncompressed
    return elements


class PowerSGD(ArmKind):
    name = "powersgd"
    compresses_gradient = True
    options = {"rank": "powersgd.rank", "warmup": "powersgd.warmup_updates"}
    words = "DDP with the PowerSGD communication hook"

    def settings(self, options, plan):
        return {"rank": options.get("rank", plan.powersgd.rank),
                "warmup_updates": options.get("warmup", plan.powersgd.warmup_updates)}

    def option_problems(self, name, options, plan):
        out = []
        if options.get("rank", 1) < 1:
            out.append(f"arms.rows: {name}'s rank={options['rank']} must be >= 1")
        if "warmup" in options:
            out += [f"arms.rows: {name}'s {line}" for line in
                    warmup_problems(plan.powersgd, options["warmup"], plan.schedule.updates)]
        return out

    def describe(self, arm):
        return f"{self.words}, rank {arm.rank}"

    def run_params(self, arm):
        return {"powersgd_rank": arm.rank, "powersgd_warmup_updates": arm.warmup_updates}

    def compresses(self, arm, update):
        return update > arm.warmup_updates

    def payload(self, arm, plan, shapes):
        dense, _ = super().payload(arm, plan, shapes)
        return dense, compressed_elements(shapes, arm.rank, plan.powersgd.min_compression_rate) * GRADIENT_BYTES

    def cost_parts(self, cost, arm, plan, padded_tokens, micro_batches, update):
        out = super().cost_parts(cost, arm, plan, padded_tokens, micro_batches, update)
        if update is None or self.compresses(arm, update):
            out["compress"] = cost.compression_s(arm.rank)
            out["error_copies_exposed"] = self.cost_details(cost, arm, plan, padded_tokens, micro_batches)["exposed_s"]
        return out

    def cost_details(self, cost, arm, plan, padded_tokens, micro_batches):
        """The compressed update's copies of the host error: their seconds, the compute that
        covers them and what is left exposed (`gradshare.cost.gpu_cost.Calibration.copies`)."""
        return cost.copies(arm, padded_tokens, micro_batches, plan.powersgd.staging_bytes())

    def link_round_s(self, arm, update, dense_round_s, compressed_round_s):
        if self.compresses(arm, update) and compressed_round_s is not None:
            return compressed_round_s
        return dense_round_s

    def probe_buffers(self, arm, plan, buckets):
        """Each bucket's P and its Q (the compressed matrices' n x r and m x r), and what it
        leaves uncompressed, at the arm's rank."""
        out = []
        for bucket in buckets:
            ps = qs = flat = 0
            for shape in bucket:
                n, m, r = as_matrix(shape, arm.rank)
                if should_compress(n, m, r, plan.powersgd.min_compression_rate)[0]:
                    ps, qs = ps + n * r, qs + m * r
                else:
                    flat += gradient_elements([shape])
            out += [GRADIENT_BYTES * x for x in (flat, ps, qs) if x]
        return out

    def attach(self, ddp, arm, plan, device, fresh):
        # The hook's code (torch) loads only in a training process: the launcher, the budget
        # check and the plan ask this kind without torch.
        from gradshare.kinds import powersgd_hook
        return powersgd_hook.Attached(ddp, arm, plan.powersgd, plan.study.seed, device, fresh)

