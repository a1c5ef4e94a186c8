"""PowerSGD for the `powersgd` arm, built on PyTorch's own DDP communication hook.

The arm uses upstream `torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`
unchanged (rank, warm-up of plain all-reduce, warm start, error feedback) with one
difference: the error-feedback memory lives in FP32 *host* memory (pinned when the
gradients are on a GPU) between exchanges. Upstream keeps one device-resident error tensor per DDP
bucket for the whole run, i.e. a second full copy of the gradients on the accelerator;
here only the bucket currently being exchanged has a transient device copy.

    state = make_powersgd_state(pg, rank=32, warmup_updates=8, warm_start=True,
                                error_feedback="fp32-host", min_compression_rate=2.0, seed=0)
    ddp_model.register_comm_hook(state, hook_for("fp32-host"))

`logical_bytes_per_exchange` gives the per-rank payload that the study reports as
communication volume.
"""
# No `from __future__ import annotations`: DDP's register_comm_hook checks the hook's
# annotations against the real dist.GradBucket / Future classes, not strings.
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _should_compress,
    powerSGD_hook,
)

ERROR_FEEDBACK_MODES = ("fp32-host", "device", "none")


class HostErrorPowerSGDState(PowerSGDState):
    """PowerSGDState whose error feedback lives in FP32 host memory between exchanges.

    `host_error` maps a DDP bucket index to its FP32 CPU error tensor (pinned when the
    bucket is on a GPU). Upstream's `error_dict` is used only as the hand-over slot for the one
    bucket being exchanged and is empty between exchanges. On CUDA the copy back to the
    host is asynchronous (ordered before DDP's wait on the bucket's future); a CPU-side
    reader of `host_error` (e.g. a checkpoint) must `torch.cuda.synchronize()` first.
    """

    # No __slots__: upstream's __getstate__ pickles `self.__slots__`, which a subclass
    # __slots__ would shadow; `host_error` goes into the instance __dict__ instead.

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_error_feedback", True)
        super().__init__(*args, **kwargs)
        if not self.use_error_feedback:
            raise ValueError("HostErrorPowerSGDState needs use_error_feedback=True")
        self.host_error: dict[int, torch.Tensor] = {}

    def __getstate__(self):
        # Upstream saves only its slots; without this a checkpoint would drop the error.
        state = super().__getstate__()
        state["host_error"] = self.host_error
        return state


def host_error_powerSGD_hook(
    state: HostErrorPowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Upstream `powerSGD_hook`, with the bucket's error staged in from / out to host memory."""
    index = bucket.index()
    buffer = bucket.buffer()
    # Same test upstream makes: plain all-reduce while iter < start_powerSGD_iter. `iter`
    # advances only after the last bucket (index 0) of a pass, so it is the same for
    # every bucket of one pass.
    compressing = state.iter >= state.start_powerSGD_iter
    if compressing and index in state.host_error:
        # Upstream adds error_dict[index] to the gradient; the error takes the bucket's
        # dtype there. On the first compressed pass there is no host error yet and
        # upstream creates the zero error itself.
        state.error_dict[index] = state.host_error[index].to(
            device=buffer.device, dtype=buffer.dtype, non_blocking=True)
    fut = powerSGD_hook(state, bucket)
    if not compressing:
        return fut  # plain all-reduce: upstream neither reads nor writes the error

    def offload_error(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        # Upstream's last callback has set error_dict[index] = input copy - decompressed.
        error = state.error_dict.pop(index)  # drop the device copy; nothing persists there
        host = state.host_error.get(index)
        if host is None or host.shape != error.shape:
            host = torch.empty(error.shape, dtype=torch.float32, device="cpu",
                               pin_memory=error.is_cuda)  # pinning helps device copies only
            state.host_error[index] = host
        host.copy_(error, non_blocking=error.is_cuda)
        return done.value()

    return _finish_on_cpu(bucket, fut.then(offload_error))


def powerSGD_hook_cpu_safe(
    state: PowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Upstream `powerSGD_hook` unchanged on CUDA; on CPU each bucket finishes before the next."""
    return _finish_on_cpu(bucket, powerSGD_hook(state, bucket))


def _finish_on_cpu(bucket: dist.GradBucket, fut: torch.futures.Future) -> torch.futures.Future:
    # Upstream issues the P and Q all-reduces from future callbacks. With NCCL those run
    # inline, in bucket order; with gloo (CPU) they run on gloo worker threads, so with two
    # or more buckets the ranks can issue collectives in different orders: a collective
    # mismatch abort, or silently mixed data if sizes agree. Waiting here keeps the order
    # DDP calls the hook in, at the cost of overlapping backward with communication on CPU.
    if bucket.buffer().device.type == "cpu":
        fut.wait()
    return fut


def make_powersgd_state(process_group, rank: int, warmup_updates: int, warm_start: bool,
                        error_feedback: str, min_compression_rate: float,
                        seed: int) -> PowerSGDState:
    """The arm's PowerSGD state; `error_feedback` is `fp32-host`, `device` or `none`.

    Exchanges (DDP hook passes, one per update) 1..warmup_updates are plain all-reduce,
    compression starts at exchange warmup_updates + 1. Upstream all-reduces while its
    counter `iter` (0 at the first pass, +1 after each pass) is below
    `start_powerSGD_iter`, i.e. for exactly `start_powerSGD_iter` passes; hence
    start_powerSGD_iter = warmup_updates, not warmup_updates + 1 (that would add a pass).
    """
    if error_feedback not in ERROR_FEEDBACK_MODES:
        raise ValueError(f"error_feedback={error_feedback!r} is not one of {ERROR_FEEDBACK_MODES}")
    if (warm_start or error_feedback != "none") and warmup_updates < 2:
        # Upstream refuses start_powerSGD_iter <= 1 here: DDP rebuilds its buckets after
        # the first pass, which would invalidate per-bucket error and P/Q memory.
        raise ValueError(f"warmup_updates={warmup_updates}: must be >= 2 with warm start "
                         "or error feedback (upstream needs start_powerSGD_iter > 1)")
    kwargs = dict(
        process_group=process_group,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=warmup_updates,
        min_compression_rate=min_compression_rate,
        use_error_feedback=error_feedback != "none",
        warm_start=warm_start,
        random_seed=seed,
    )
    if error_feedback == "fp32-host":
        return HostErrorPowerSGDState(**kwargs)
    return PowerSGDState(**kwargs)


def hook_for(error_feedback: str):
    """The DDP communication hook that goes with `make_powersgd_state(error_feedback=...)`."""
    return host_error_powerSGD_hook if error_feedback == "fp32-host" else powerSGD_hook_cpu_safe


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
        compress, uncompressed, compressed = _should_compress(n, m, r, min_compression_rate)
        elements += compressed if compress else uncompressed
    return elements * element_bytes
