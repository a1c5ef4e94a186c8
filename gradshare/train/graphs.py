"""Packed micro-batches run as CUDA graphs: each shape's forward and backward captured once.

On the study's documents an update is ~0.17 s of GPU work inside ~0.47 s of host time: the
host launches ~2,400 matrix products and ~1,000 gradient additions per update, each through
the compiled layers' Python wrappers and the autograd engine (BENCHMARKS.md, 2026-12-04).
A graph replays all of one micro-batch's kernels with one launch.

What one step computes, on static tensors only (so that it can be replayed):

    with autocast:  nll = net(ids, tgt=tgt, seg=seg, pos=pos).sum()
    (nll * scale).backward()                        # accumulates into every .grad in place
    local += [nll, target tokens, tokens]           # the update's running sums, FP64

`net` is the model with its loss (`TokenLoss`), never DDP: a DDP arm's micro-batches only
accumulate, and the update's one exchange is a pass of its own through DDP afterwards
(`TokenLoss` with no inputs). Every shape is compiled and captured at start-up on made-up
data (`prepare`), so that no update compiles or captures; the caller zeroes the gradients
after it. Gradients must exist (zeroed, never set to None) before capture: a graph writes to
the addresses it saw.

Where capture fails (an operation that cannot be captured), the reason is kept in `failed`
and every step runs eagerly: the same function, launched by the host. On a CPU nothing is
captured and every step runs eagerly: the path the CPU tests check against the plain loop.
"""
from __future__ import annotations

import contextlib

import torch

from gradshare.model.batching import PAD_SEGMENT

INPUTS = ("ids", "tgt", "seg", "pos")
WARMUP_RUNS = 2  # before capture: compile, autotune, cuBLAS workspaces, on the capture stream


def made_up_batch(shape: tuple[int, int], vocab: int) -> dict[str, torch.Tensor]:
    """Start-up data of one packed shape (host tensors): one full document per row, every token
    but the first a target; seeded, so that every rank and every run makes the same."""
    n, t = shape
    g = torch.Generator().manual_seed(n * 100_003 + t)
    tgt = torch.ones(n, t, dtype=torch.bool)
    tgt[:, 0] = False
    return {"ids": torch.randint(0, vocab, (n, t), generator=g), "tgt": tgt,
            "seg": torch.zeros(n, t, dtype=torch.long), "pos": torch.arange(t).expand(n, t).contiguous()}


class StaticSteps:
    def __init__(self, net, device: torch.device, autocast_dtype: torch.dtype | None, capture: bool,
                 vocab: int, log=print):
        self.net = net
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.capture = capture and device.type == "cuda"
        self.vocab = vocab
        self.log = log
        self.scale = torch.zeros((), dtype=torch.float32, device=device)
        self.local = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, targets, tokens
        self.buffers: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.failed: str | None = None
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # cache_enabled=False: a cached cast would outlive the capture that made it
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False)

    def _step(self, b: dict[str, torch.Tensor]) -> None:
        with self._autocast():  # the forward only; backward runs in the ops' own dtypes
            nll = self.net(b["ids"], tgt=b["tgt"], seg=b["seg"], pos=b["pos"]).sum()
        (nll * self.scale).backward()
        self.local += torch.stack([nll.detach().double(), b["tgt"][:, 1:].sum().double(),
                                   (b["seg"] != PAD_SEGMENT).sum().double()])

    def prepare(self, shapes: list[tuple[int, int]]) -> None:
        """Compile every shape, and on CUDA capture it, before the first update. Runs the model on
        made-up data: the caller zeroes the gradients afterwards."""
        for shape in shapes:
            b = {k: v.to(self.device) for k, v in made_up_batch(shape, self.vocab).items()}
            self.buffers[shape] = b
            self.scale.fill_(1.0)
            if not self.capture or self.failed:
                self._step(b)  # compiles this shape where the layers are compiled
                continue
            try:
                # The training loop's own stream (`loop.train` runs on one that is not the
                # default): warm-ups and capture where DDP's gradient accumulations were made.
                stream = torch.cuda.current_stream(self.device)
                for _ in range(WARMUP_RUNS):
                    self._step(b)
                graph = torch.cuda.CUDAGraph()
                # thread_local: the process group's watchdog and the host allocator query events
                # from threads of their own while this thread captures
                with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                    self._step(b)
                self.graphs[shape] = graph
            except torch.OutOfMemoryError:
                raise  # the arm does not fit: its reason, not an eager fallback that needs more
            except Exception as exc:  # the same function runs eagerly; the reason is kept and logged
                torch.cuda.synchronize(self.device)
                self.failed = f"capture of micro-batch shape {shape} failed: {type(exc).__name__}: " \
                              f"{(str(exc).splitlines() or [''])[0][:300]}"
                self.graphs.clear()
                self.log(f"[gradshare] CUDA graphs off, micro-batches run eagerly: {self.failed}")
        if self.capture:  # the warm-ups' blocks, cached for the side stream, back to the card
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self.local.zero_()

    def begin_update(self, scale: float) -> None:
        """The update's normalisation (world / the global batch's target tokens); its sums from zero."""
        self.scale.fill_(scale)
        self.local.zero_()

    def run(self, host: dict[str, torch.Tensor], shape: tuple[int, int]) -> None:
        """One micro-batch: its inputs into the shape's static tensors, then its graph (or step)."""
        b = self.buffers.get(shape)
        if b is None:
            raise RuntimeError(f"micro-batch shape {shape} was not prepared at start-up "
                               f"(prepared: {sorted(self.buffers)})")
        for k in INPUTS:
            b[k].copy_(host[k], non_blocking=True)
        graph = self.graphs.get(shape)
        if graph is not None:
            graph.replay()
        else:
            self._step(b)
