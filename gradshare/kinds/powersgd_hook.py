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

`gradshare.kinds.powersgd.compressed_elements` gives the per-rank payload that the study reports
as communication volume; `Attached` is what the `powersgd` kind hands the training loop.
"""
# No `from __future__ import annotations`: DDP's register_comm_hook checks the hook's
# annotations against the real dist.GradBucket / Future classes, not strings.
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gradshare.kinds.base import ExchangeHook
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _orthogonalize,
    _should_compress,
    powerSGD_hook,
)

ERROR_FEEDBACK_MODES = ("fp32-host", "device", "none")
HOOKS = ("upstream", "fast")
ORTHOGONALIZATIONS = ("qr", "cholesky-qr2")
COPY_OVERLAP = "fold"  # how the fast hook moves the error (gradshare.cost.gpu_cost.Calibration.copy_overlap)
COMPRESSION = "powersgd: compression"  # the profiler's name for one bucket's compression


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


def check_error_size(index: int, error: torch.Tensor, buffer: torch.Tensor) -> None:
    """A staged error must be the size of its bucket: a restored state registered on a DDP
    whose buckets differ (a fresh DDP's first pass uses its pre-rebuild bucket) would
    otherwise fail deep in upstream with a size mismatch."""
    if error.numel() != buffer.numel():
        raise RuntimeError(
            f"PowerSGD error feedback for bucket {index} has {error.numel()} elements but the bucket has "
            f"{buffer.numel()}: the state was saved with another bucket layout. Resume makes one plain "
            f"pass (DDP's bucket rebuild) before it registers a restored state")


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
        check_error_size(index, state.host_error[index], buffer)
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


class FastHostErrorPowerSGDState(HostErrorPowerSGDState):
    """State of `fast_host_error_powerSGD_hook`: upstream's slots (rank, iter, P/Q memories,
    RNG) plus the host error, the orthogonalisation, and the CUDA copy streams (not pickled)."""

    def __init__(self, *args, orthogonalization: str = "qr", staging_mb: int = 1024, host_error_numel: int = 0,
                 **kwargs):
        super().__init__(*args, **kwargs)
        if orthogonalization not in ORTHOGONALIZATIONS:
            raise ValueError(f"orthogonalization={orthogonalization!r} is not one of {ORTHOGONALIZATIONS}")
        self.orthogonalization = orthogonalization
        self.staging_bytes = staging_mb * 2**20
        self._copies = None  # _ErrorCopies, made at the first compressed CUDA pass
        # The whole FP32 host error, pinned, allocated now, at start-up: pinning 6.9 GB took 6 s
        # on the H200's host, which made the first compressed update 6 s long (2026-12-04).
        # Buckets take consecutive pieces at the first compressed pass, in index order.
        # Each bucket's Q shapes, and the pass whose Q are orthogonalised (`_orthogonalize_every_q`)
        self.q_layout: dict[int, list[torch.Size]] = {}
        self.q_orthogonalized_at = -1
        self.q_done: set[int] = set()
        # Buckets whose buffer is their parameters' gradients (`fold_errors` adds into them), and
        # the buckets of this update whose error is in their gradients already
        self.bucket_buffers: dict[int, torch.Tensor] = {}
        self.bucket_params: dict[int, list[tuple[torch.nn.Parameter, int]]] = {}
        self.folded: set[int] = set()
        self._host_pool = (torch.zeros(host_error_numel, dtype=torch.float32,
                                       pin_memory=torch.cuda.is_available()) if host_error_numel else None)
        self._pool_at = 0

    def new_host_error(self, numel: int, pin: bool) -> torch.Tensor:
        """A bucket's FP32 host error: the next piece of the start-up pool where it has room, else
        a fresh (zeroed: the host touches every page now, not at the first copy) tensor."""
        pool = self._host_pool
        if pool is not None and self._pool_at + numel <= pool.numel():
            self._pool_at += numel
            return pool[self._pool_at - numel:self._pool_at]
        return torch.zeros(numel, dtype=torch.float32, device="cpu", pin_memory=pin)

    def __getstate__(self):
        state = super().__getstate__()
        state["orthogonalization"] = self.orthogonalization
        state["staging_bytes"] = self.staging_bytes
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._copies = None
        self._host_pool, self._pool_at = None, 0  # a restored state brings its error with it
        self.q_layout, self.q_orthogonalized_at, self.q_done = {}, -1, set()  # relearnt in the next pass
        self.bucket_buffers, self.bucket_params, self.folded = {}, {}, set()


class _ErrorCopies:
    """The FP32 error's trips between pinned host memory and the GPU, on two side streams.

    In: a bucket's error is copied up on `up` ahead of its hook, and the compute stream waits for
    it by event only. The first buckets' errors go up at the start of the update, during its
    micro-batches (`prefetch_errors`); each hook then tops up the buckets after its own. Out: the
    new error goes down on `down` after the compute stream's event; its device memory is freed
    once the copy is done (record_stream), and the last copies of an update run on into the
    next one's micro-batches. Errors on the device in either direction, together, stay within
    `staging_bytes`: beyond that nothing more is fetched, and a hook waits (on the host) for
    its oldest copy down, so device memory stays bounded whatever the link's speed. Host copies
    are ordered: a bucket's next copy up waits for its last copy down.
    """

    def __init__(self, device: torch.device, staging_bytes: int):
        self.device = device
        self.up = torch.cuda.Stream(device)
        self.down = torch.cuda.Stream(device)
        self.staging_bytes = staging_bytes
        self.prefetched: dict[int, tuple[torch.Tensor, torch.cuda.Event]] = {}
        self.down_done: dict[int, torch.cuda.Event] = {}
        self.in_flight: list[tuple[torch.cuda.Event, int]] = []
        self.fetched_early = 0  # bytes fetched before their hook's call, this update

    def _held(self) -> int:
        self.in_flight = [(e, n) for e, n in self.in_flight if not e.query()]  # query: no sync
        return sum(n for _, n in self.in_flight) + sum(t.numel() * t.element_size()
                                                      for t, _ in self.prefetched.values())

    def fetch(self, index: int, host: torch.Tensor, dtype: torch.dtype, device) -> None:
        if index in self.prefetched:
            return
        with torch.cuda.stream(self.up):
            done = self.down_done.get(index)
            if done is not None:
                self.up.wait_event(done)
            dev = host.to(device=device, dtype=dtype, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.up)
        self.prefetched[index] = (dev, ev)

    def top_up(self, host_error: dict[int, torch.Tensor], start: int, device, early: bool = False,
               skip: set[int] = frozenset()) -> None:
        """Fetch buckets start, start + 1, ... (the order DDP calls the hook in) while the
        staging budget allows; `skip`: buckets whose error is in their gradients already."""
        index = start
        while index in host_error:
            host = host_error[index]
            if index not in self.prefetched and index not in skip:
                size = host.numel() * host.element_size()
                if size > self.staging_bytes:  # never fits (say the embedding's bucket): its hook fetches it
                    index += 1
                    continue
                if self._held() + size > self.staging_bytes:
                    return
                self.fetch(index, host, host.dtype, device)
                if early:
                    self.fetched_early += size
            index += 1

    def hold_until_used(self, dev: torch.Tensor) -> None:
        """A fetched error that the compute stream reads later than now (`fold_errors`' add): it
        counts against the staging budget until that read has run, since the CPU runs ahead of
        the GPU (a whole micro-batch is one graph launch) and would otherwise fetch the next
        buckets into memory still in use."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(dev.device))
        self.in_flight.append((ev, dev.numel() * dev.element_size()))

    def take(self, index: int) -> torch.Tensor:
        dev, ev = self.prefetched.pop(index)
        main = torch.cuda.current_stream(dev.device)
        main.wait_event(ev)
        dev.record_stream(main)
        return dev

    def store(self, index: int, dev: torch.Tensor, host: torch.Tensor) -> None:
        main = torch.cuda.current_stream(dev.device)
        self.down.wait_stream(main)
        with torch.cuda.stream(self.down):
            host.copy_(dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.down)
        dev.record_stream(self.down)
        self.down_done[index] = ev
        self._held()  # drops finished copies
        self.in_flight.append((ev, dev.numel() * dev.element_size()))
        while len(self.in_flight) > 1 and self._held() > self.staging_bytes:
            # A host-side wait: the allocator frees a block recorded on `down` only once its
            # copy is done, so a GPU-side wait alone would let the CPU run ahead and allocate.
            self.in_flight.pop(0)[0].synchronize()


def prefetch_errors(state) -> int:
    """At the start of an update that will compress: send the first buckets' host errors up to the
    GPU during the micro-batches, as far as the fast hook's staging budget allows. Returns the
    bytes sent (0 where nothing is staged: another hook, the CPU, or a warm-up update)."""
    if hasattr(state, "folded"):
        state.folded = set()
    copies = getattr(state, "_copies", None)
    if copies is None or state.iter < state.start_powerSGD_iter or not state.host_error:
        return 0
    copies.fetched_early = 0
    copies.top_up(state.host_error, 0, copies.device, early=True)
    return copies.fetched_early


def fold_errors(state) -> int:
    """After a micro-batch of an update that will compress (the fast hook): add the host errors
    that have arrived into their buckets' gradients, then send the next buckets' errors up, to
    arrive during the next micro-batch. Returns the bytes sent up.

    Upstream adds a bucket's error to its gradient in the hook, after every micro-batch; here each
    error sent up during the last micro-batch is added between micro-batches (the compute stream
    waits for its copy, on the device), into the gradients the later micro-batches accumulate into:
    the same sum in another order (FP32 rounding apart), and the staging memory of a folded
    bucket is free again for the next ones, so that the error's trip up runs beside the
    micro-batches instead of in the exchange. Only where the gradients are views of DDP's buckets
    (`hardware.gradient_as_bucket_view`: the hook has seen each bucket's buffer); elsewhere the
    hook adds the error as upstream does. On a CPU every bucket is folded at the first call: the
    host error is the working copy, and nothing travels."""
    if not isinstance(state, FastHostErrorPowerSGDState) or state.iter < state.start_powerSGD_iter:
        return 0
    buffers, copies = state.bucket_buffers, state._copies
    if copies is None:
        for index, host in state.host_error.items():
            if index in buffers and index not in state.folded and _still_views(state, index):
                buffers[index].add_(host.to(buffers[index].dtype))
                state.folded.add(index)
        return 0
    for index in sorted(copies.prefetched):  # sent up during the micro-batch just run
        if index in buffers and index not in state.folded and _still_views(state, index):
            dev = copies.take(index)  # the compute stream waits for its copy on the device, not the host
            buffers[index].add_(dev)
            copies.hold_until_used(dev)
            state.folded.add(index)
    copies.fetched_early = 0
    copies.top_up(state.host_error, 0, copies.device, early=True, skip=state.folded)
    return copies.fetched_early


def _cholesky_qr2(x: torch.Tensor) -> None:
    """Orthonormalise the columns of every matrix of the batch `x` (b, n, r) in place.

    Two passes of X <- X R^-1 with R^T R = X^T X + shift, each pass three batched GEMMs and two
    solves on r x r matrices: the Gram X^T X, the r x r inverse of the Cholesky factor (a
    triangular solve against the identity), then X R^-1 as one GEMM. (Solving the tall X against R
    directly, one triangular solve of n x r per matrix, measured slower than Householder QR on the
    GPU, 2026-12-04.) The first pass's shift (1e-5 of the Gram trace, above the Gram's FP32
    rounding) keeps the factorisation finite for a rank-deficient X; the second pass, on columns
    that are already nearly orthonormal, needs only 1e-7 and restores orthogonality to about 1e-6.
    For full-rank X this is QR's Q up to column signs; for a rank-deficient X the deficient
    columns come out near zero, where Householder QR makes them arbitrary orthonormal
    directions: there the two differ (tests/unit/train/test_fast_path.py).
    """
    eye = torch.eye(x.shape[2], device=x.device, dtype=x.dtype).expand(x.shape[0], -1, -1)
    for shift in (1e-5, 1e-7):
        gram = torch.bmm(x.transpose(1, 2), x)
        diag = gram.diagonal(dim1=1, dim2=2)
        diag.add_(diag.sum(dim=1, keepdim=True) * shift + 1e-30)
        lower, _ = torch.linalg.cholesky_ex(gram)
        # R = L^T, so R^-1 = (L^-1)^T
        inverse = torch.linalg.solve_triangular(lower, eye, upper=False).transpose(1, 2)
        x.copy_(torch.bmm(x, inverse))


def _orthogonalize_batch(x: torch.Tensor, method: str, epsilon: float) -> None:
    if method == "cholesky-qr2" and x.shape[2] > 2 and x.dtype == torch.float32:
        _cholesky_qr2(x)
    else:
        _orthogonalize(x, epsilon)  # upstream: one Householder QR per matrix of the batch


def _as_batch(mats: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor | None:
    """Same-shaped matrices of one bucket as one (b, n, m) view of the bucket, without a copy,
    where they lie at equal distances in it (say an MLP's gate and up projections, side by side);
    None where they do not (each is then multiplied on its own)."""
    if len(mats) < 2 or not all(m.is_contiguous() and m.untyped_storage().data_ptr()
                                == buffer.untyped_storage().data_ptr() for m in mats):
        return None  # a matrix stored column by column, or outside the bucket: no row-major batch
    starts = [m.storage_offset() for m in mats]
    step = starts[1] - starts[0]
    n, m = mats[0].shape
    if step < n * m or any(b - a != step for a, b in zip(starts, starts[1:])):
        return None
    return buffer.as_strided((len(mats), n, m), (step, m, 1), starts[0])


def _product(mats: list[torch.Tensor], batch: torch.Tensor | None, rhs: torch.Tensor, out: torch.Tensor,
             transpose: bool = False) -> None:
    """out[i] = M_i rhs[i] (or M_i^T rhs[i]): one batched GEMM where the matrices form a batch."""
    if batch is not None:
        torch.bmm(batch.transpose(1, 2) if transpose else batch, rhs, out=out)
        return
    for i, mat in enumerate(mats):
        torch.mm(mat.t() if transpose else mat, rhs[i], out=out[i])


def _orthogonalize_every_q(state, method: str, epsilon: float) -> None:
    """Warm start: every bucket's Q (kept from the last compressed pass) orthogonalised at the
    pass's first bucket, one batched call per shape across all buckets instead of one per shape
    and bucket. Each matrix is orthogonalised on its own either way (a batched QR or CholeskyQR2
    treats the matrices of a batch independently), so the result is the same up to FP32 rounding:
    exactly on a CPU (LAPACK, one matrix at a time); on a GPU a batch of another size may take
    another kernel for the products. Only the number of calls changes."""
    by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
    for index, shapes in state.q_layout.items():
        q_mem = state.q_memory_dict.get(index)
        if q_mem is None:
            continue
        at = 0
        for b, m, r in shapes:
            by_shape.setdefault((m, r), []).append(q_mem[at:at + b * m * r].view(b, m, r))
            at += b * m * r
    for views in by_shape.values():
        stacked = torch.cat(views) if len(views) > 1 else views[0]
        _orthogonalize_batch(stacked, method, epsilon)
        if len(views) > 1:
            at = 0
            for v in views:
                v.copy_(stacked[at:at + v.shape[0]])
                at += v.shape[0]
    state.q_done = set(state.q_layout)


def _compress(state, bucket: dist.GradBucket, index: int, buffer: torch.Tensor, group, world: int) -> None:
    """Upstream's compression of one bucket (error added already), in place: the bucket holds the
    decompressed average afterwards."""
    # Upstream's split and order: compressed matrices grouped by shape in first-seen order.
    groups: dict[torch.Size, list[torch.Tensor]] = {}
    uncompressed = []
    for tensor in bucket.gradients():
        matrix = tensor.view(tensor.shape[0], -1)
        n, m = matrix.shape
        r = min(n, m, state.matrix_approximation_rank)
        compress, before, after = _should_compress(n, m, r, state.min_compression_rate)
        state.total_numel_before_compression += before
        state.total_numel_after_compression += after if compress else before
        if compress:
            groups.setdefault(matrix.shape, []).append(matrix)
        else:
            uncompressed.append(tensor)
    p_size = q_size = 0
    for (n, m), mats in groups.items():
        r = min(n, m, state.matrix_approximation_rank)
        p_size += len(mats) * n * r
        q_size += len(mats) * m * r
    fresh = not state.warm_start or index not in state.p_memory_dict
    if fresh:
        state.p_memory_dict[index] = torch.empty(p_size, device=buffer.device, dtype=buffer.dtype)
        state.q_memory_dict[index] = torch.empty(q_size, device=buffer.device, dtype=buffer.dtype)
    p_mem, q_mem = state.p_memory_dict[index], state.q_memory_dict[index]
    ps, qs = [], []
    p_at = q_at = 0
    for (n, m), mats in groups.items():
        r = min(n, m, state.matrix_approximation_rank)
        ps.append(p_mem[p_at:p_at + len(mats) * n * r].view(len(mats), n, r))
        qs.append(q_mem[q_at:q_at + len(mats) * m * r].view(len(mats), m, r))
        p_at += len(mats) * n * r
        q_at += len(mats) * m * r
    method, eps = state.orthogonalization, state.orthogonalization_epsilon
    state.q_layout[index] = [q.shape for q in qs]
    if not fresh:
        if state.q_orthogonalized_at != state.iter:  # the pass's first bucket: every bucket's Q at once
            _orthogonalize_every_q(state, method, eps)
            state.q_orthogonalized_at = state.iter
        if index not in state.q_done:  # a bucket the pass's first call did not know of
            for q in qs:
                _orthogonalize_batch(q, method, eps)
    else:
        with torch.random.fork_rng(devices=[]):
            # Upstream's draw: one seed per pass from the state's RNG, one CPU randn per matrix.
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                b, m, r = q.shape
                q.copy_(torch.cat([torch.randn(1, m, r, device="cpu", dtype=buffer.dtype)
                                   for _ in range(b)]))
                _orthogonalize_batch(q, method, eps)

    flat = torch.cat([t.view(-1) for t in uncompressed]) if uncompressed else None
    if flat is not None:
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        at = 0
        for t in uncompressed:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()
    batches = [_as_batch(mats, buffer) for mats in groups.values()]
    for mats, batch, p, q in zip(groups.values(), batches, ps, qs):
        _product(mats, batch, q, p)  # P = M Q
    dist.all_reduce(p_mem, group=group)
    for mats, batch, p, q in zip(groups.values(), batches, ps, qs):
        _orthogonalize_batch(p, method, eps)
        _product(mats, batch, p, q, transpose=True)  # Q = M^T P
    dist.all_reduce(q_mem, group=group)
    q_mem.div_(world)
    for mats, batch, p, q in zip(groups.values(), batches, ps, qs):
        if batch is not None:  # M = P Q^T
            torch.bmm(p, q.transpose(1, 2), out=batch)
        else:
            for i, mat in enumerate(mats):
                torch.mm(p[i], q[i].t(), out=mat)


def _still_views(state, index: int) -> bool:
    """Whether the bucket's parameters still accumulate into its buffer: gradients set to None
    since (`zero_grad(set_to_none=True)`) accumulate into fresh tensors, which the reducer copies
    over the buffer at the exchange; an error folded into the buffer would be lost. Such a
    bucket is dropped, and its hook adds the error as upstream does."""
    if all(p.grad is not None and p.grad.data_ptr() == ptr for p, ptr in state.bucket_params[index]):
        return True
    del state.bucket_buffers[index], state.bucket_params[index]
    return False


def _gradients_are_views(bucket: dist.GradBucket) -> bool:
    """Whether every parameter's gradient is its slice of the bucket's buffer
    (`gradient_as_bucket_view`), so that adding into the buffer adds into the gradients."""
    params, views = bucket.parameters(), bucket.gradients()
    return len(params) == len(views) and all(
        p.grad is not None and p.grad.data_ptr() == v.data_ptr() and p.grad.numel() == v.numel()
        for p, v in zip(params, views))


def fast_host_error_powerSGD_hook(
    state: FastHostErrorPowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Upstream `powerSGD_hook`'s function (same P/Q layout, RNG, warm start, error feedback, `iter`),
    issued in one pass per bucket instead of a chain of callbacks, with:
      - orthogonalisation of all same-shaped P (or Q) of the bucket in one batched call;
      - P = M Q, Q = M^T P and M = P Q^T per matrix into upstream's P/Q memory, no stacked copies;
      - no device-wide synchronize (upstream synchronizes the GPU in every bucket's callback);
      - the FP32 error in pinned host memory, staged up and down on side streams.
    The collectives are issued from the hook call itself, in bucket order on every rank, so
    gloo cannot reorder them across buckets.
    """
    buffer = bucket.buffer()
    index = bucket.index()
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = group.size()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return _finish_on_cpu(bucket, default_hooks._allreduce_fut(group, buffer))

    cuda = buffer.is_cuda
    host = state.host_error.get(index)
    if cuda and state._copies is None:
        state._copies = _ErrorCopies(buffer.device, state.staging_bytes)
    copies = state._copies if cuda else None
    if index not in state.bucket_buffers and _gradients_are_views(bucket):
        state.bucket_buffers[index] = buffer
        state.bucket_params[index] = list(zip(bucket.parameters(), (g.data_ptr() for g in bucket.gradients())))
    # `work` holds the bucket plus its error, then the new error (upstream's input_tensor_cp).
    if host is None or index in state.folded:
        work = buffer.clone()  # the first compressed pass (a zero error), or the error folded in already
    else:
        check_error_size(index, host, buffer)
        if copies is not None:
            copies.fetch(index, host, buffer.dtype, buffer.device)  # at once, unless fetched early
            work = copies.take(index).to(buffer.dtype)  # fetched early in the host's FP32
        else:
            work = host.to(dtype=buffer.dtype)  # the CPU: host error is the working copy
        buffer.add_(work)
        work.copy_(buffer)
    if copies is not None and not bucket.is_last():  # the next buckets' errors travel up while this one is compressed
        copies.top_up(state.host_error, index + 1, buffer.device, skip=state.folded)

    with torch.profiler.record_function(COMPRESSION):  # its own row in a profile (gpu_path's compression time)
        _compress(state, bucket, index, buffer, group, world)

    work.sub_(buffer)  # the new error: bucket plus old error, minus what was communicated
    if host is None or host.shape != work.shape:
        host = state.new_host_error(work.numel(), pin=cuda)
        state.host_error[index] = host
    if copies is not None:
        copies.store(index, work, host)
    elif host.data_ptr() != work.data_ptr():
        host.copy_(work)
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    if bucket.is_last():
        state.folded = set()
    state.maybe_increase_iter(bucket)
    fut = torch.futures.Future(devices=[buffer.device]) if cuda else torch.futures.Future()
    fut.set_result(buffer)
    return _finish_on_cpu(bucket, fut)


def make_powersgd_state(process_group, rank: int, warmup_updates: int, warm_start: bool,
                        error_feedback: str, min_compression_rate: float,
                        seed: int, hook: str = "upstream", orthogonalization: str = "qr",
                        staging_mb: int = 1024, host_error_numel: int = 0) -> PowerSGDState:
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
    if hook not in HOOKS:
        raise ValueError(f"hook={hook!r} is not one of {HOOKS}")
    if hook == "fast":
        if error_feedback != "fp32-host":
            raise ValueError(f"hook=fast keeps the error on the host: error_feedback={error_feedback!r}")
        return FastHostErrorPowerSGDState(orthogonalization=orthogonalization, staging_mb=staging_mb,
                                          host_error_numel=host_error_numel, **kwargs)
    if error_feedback == "fp32-host":
        return HostErrorPowerSGDState(**kwargs)
    return PowerSGDState(**kwargs)


def hook_for(error_feedback: str, hook: str = "upstream"):
    """The DDP communication hook that goes with `make_powersgd_state(error_feedback=..., hook=...)`."""
    if hook == "fast":
        return fast_host_error_powerSGD_hook
    return host_error_powerSGD_hook if error_feedback == "fp32-host" else powerSGD_hook_cpu_safe


class Attached(ExchangeHook):
    """A `powersgd` arm's hook on one process's DDP: the state `make_powersgd_state` makes from the
    plan's `powersgd` section and the arm's rank and warm-up, and the hook that goes with it."""

    def __init__(self, ddp, arm, p, seed: int, device: torch.device, fresh: bool):
        self.ddp, self.p = ddp, p
        # a fresh GPU run pins its whole host error now (a resumed one brings its own)
        pool = sum(q.numel() for q in ddp.parameters() if q.requires_grad) \
            if (device.type == "cuda" and fresh and p.hook == "fast") else 0
        self.state = make_powersgd_state(dist.group.WORLD, arm.rank, arm.warmup_updates, p.warm_start,
                                         p.error_feedback, p.min_compression_rate, seed, hook=p.hook,
                                         orthogonalization=p.orthogonalization, staging_mb=p.staging_mb,
                                         host_error_numel=pool)

    def register(self) -> None:
        self.ddp.register_comm_hook(self.state, hook_for(self.p.error_feedback, self.p.hook))

    def saved(self) -> dict:
        """The state's picklable content (upstream's __getstate__ plus host_error)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # host_error is written on side streams
        return self.state.__getstate__()

    def restore(self, saved: dict, device: torch.device) -> None:
        """Read onto the CPU, the P and Q memories (and any device error) go back to `device`; the
        FP32 host error stays in host memory, pinned where the device is a GPU (its copies run on
        side streams)."""
        state = self.state
        state.__setstate__(saved)
        for name in ("p_memory_dict", "q_memory_dict", "error_dict"):
            held = getattr(state, name, None)
            if held:
                setattr(state, name, {k: v.to(device) for k, v in held.items()})
        if device.type == "cuda" and getattr(state, "host_error", None):
            state.host_error = {k: v.pin_memory() for k, v in state.host_error.items()}

    def before_micro_batches(self) -> int:
        return prefetch_errors(self.state)

    def between_micro_batches(self) -> int:
        # the errors sent up so far into the gradients, the next ones up
        return fold_errors(self.state) if self.p.fold_errors else 0

    def passes(self) -> int:
        return self.state.iter
