"""The one training loop of every arm.

The arms differ only in how the gradient is communicated, which their kind
(`gradshare.kinds`) decides: one process by gradient accumulation, or DDP with the kind's hook
(`ArmKind.attach`: none for dense, PowerSGD's with its host-resident FP32 error). Everything
else — seed, schedule, global target normalisation, clipping, AdamW — is the same code path.
Run by `gradshare.train.worker` under `accelerate launch`.

An update reads top to bottom: learning rate; micro-batches under `no_sync` until the last (so
exactly one gradient exchange per update), the kind's hook told between them (PowerSGD folds its
host error into the gradients there, where `powersgd.fold_errors`); the global loss; clip; step;
`zero_grad(set_to_none=True)`; metering.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradshare.contract import metrics as M
from gradshare.contract.arms_plan import Arm
from gradshare.contract.plan import Plan
from gradshare.kinds.base import ExchangeHook
from gradshare.cost.volume import ExchangeBytes, exchange_bytes
from gradshare.data.documents import encode
from gradshare.data.schedule import rank_share, update_sha256
from gradshare.hosts.metering import (
    Clock,
    add_into,
    gather,
    host_counters,
    per_host_delta,
)
from gradshare.model import batching
from gradshare.model.batching import for_plan as micro_batches
from gradshare.model.lm import TokenLoss, collate, compile_layers
from gradshare.train import faults as F
from gradshare.train import fullstate
from gradshare.train.graphs import StaticSteps, made_up_batch
from gradshare.train.memory import DeviceMemoryError, out_of_memory_reason
from gradshare.train.profiling import ProfileRequest, profiled
from gradshare.util.devices import indexed


class DivergenceError(RuntimeError):
    pass


@dataclass
class LoopResult:
    losses: list[float] = field(default_factory=list)
    active_s: float = 0.0
    tokens: int = 0
    logical_bytes: int = 0
    logical_bytes_post_warmup: int = 0
    wire: dict = field(default_factory=dict)  # host id -> summed deltas of the update windows
    wire_first: list = field(default_factory=list)  # every rank's counters as update 1 starts
    hook_passes: int | None = None  # the kind's hook's exchange count (one per update), where it counts
    graphs: dict | None = None  # packed micro-batches: shapes prepared, graphs captured, why not
    error_prefetched_bytes: int = 0  # what the hook sent beside the micro-batches (PowerSGD's host error)


@dataclass
class FullStatePolicy:
    """When and where one arm saves full states (`gradshare.train.fullstate`), and the one it
    resumes from."""
    every: int = 0
    """Save after every `every`-th update but the last; 0: never."""
    root: Path | None = None
    """Where rank 0 writes them."""
    on_saved: Callable | None = None
    """Rank 0, after each save: on_saved(path, manifest)."""
    resume: dict | None = None
    """A loaded full state (`fullstate.load`) to continue from."""

    def saves_after(self, update: int, updates: int) -> bool:
        """Whether a full state is saved after `update` (never after the last: the checkpoint is)."""
        return bool(self.every) and update % self.every == 0 and update < updates


_TOTALS = ("losses", "active_s", "tokens", "logical_bytes", "logical_bytes_post_warmup", "wire")


def _save_full_state(fs: FullStatePolicy, u: int, arm: str, model, opt, hook: ExchangeHook, res: "LoopResult",
                     rank: int, world: int) -> None:
    """Every rank's RNG and hook state (its kind's, `ExchangeHook.saved`) to rank 0, which writes
    the whole state atomically."""
    mine = {"rng": fullstate.rng_state(), "hook": hook.saved()}
    if world > 1:
        ranks = [None] * world if rank == 0 else None
        dist.gather_object(mine, ranks, dst=0)
    else:
        ranks = [mine]
    if rank == 0:
        loop = {"update": u, **{k: getattr(res, k) for k in _TOTALS}}
        path, manifest = fullstate.save(fs.root, u, arm, world, model.state_dict(), opt.state_dict(), ranks, loop)
        if fs.on_saved:
            fs.on_saved(path, manifest)
    if world > 1:  # no rank goes on (or dies) before the state is saved and uploaded whole
        dist.barrier()


def _lr(plan: Plan, update: int) -> float:
    o = plan.optim
    if o.warmup_updates and update <= o.warmup_updates:
        return o.lr * update / o.warmup_updates
    return o.lr


def prebuilds_buckets(plan: Plan) -> bool:
    """Whether a DDP arm builds its final buckets before training (`prebuild_buckets`): on a GPU
    (memory), and wherever the plan asks for graphs (which hold the gradients' addresses; on a
    CPU, so that the tests run the GPU's path)."""
    return plan.hardware.device == "cuda" or plan.hardware.cuda_graphs


def prebuild_buckets(ddp, width: int, vocab: int) -> None:
    """DDP's final buckets, built before training, where nothing but the weights is allocated.

    DDP starts with one bucket holding every parameter; after its first exchanging backward it
    rebuilds the buckets in the order the gradients arrived, at the next forward, holding old
    and new buckets at once: a second full FP32 gradient (6.9 GB at 1.7B) on top of AdamW's
    state at update 2 (46.4 GiB measured on an H200). Here one backward of a made-up two-row
    batch records the real order (the same buckets as training's first backward would give,
    so PowerSGD's per-bucket draws are those of the plain path), and an exchange pass
    (`TokenLoss` with no inputs) rebuilds at its forward. Both exchanges are plain all-reduces
    (no PowerSGD hook is registered yet); the caller zeroes the gradients they leave."""
    x = made_up_batch((2, width), vocab)
    device = next(ddp.parameters()).device
    ddp(**{k: v.to(device) for k, v in x.items()}).sum().backward()
    # The gradients are views of the first buckets now: dropped, the rebuild frees those buckets
    # before it allocates the final ones. Kept, each view would hold its old bucket alive beside
    # the new one: two full FP32 gradients at start-up. The exchange pass's backward then makes
    # every gradient a view of its final bucket (`gradient_as_bucket_view`).
    ddp.zero_grad(set_to_none=True)
    ddp(ids=None).backward()


def wrap_for_arm(model, arm: Arm, plan: Plan, device: torch.device,
                 register_hook: bool = True) -> tuple[torch.nn.Module, ExchangeHook]:
    """The model with its token loss (`TokenLoss`), and the hook of the arm's kind: one process
    as is (no hook), a DDP kind in DDP with its kind's hook (`ArmKind.attach`). The plan's
    hardware levers are applied here, in one place, and each computes the same function as the
    plain path. `register_hook=False`: the hook is made but not registered (resume registers it
    once DDP's buckets are final and the saved state is restored into it)."""
    h = plan.hardware
    static = plan.schedule.micro_batch_tokens > 0  # packed micro-batches: a few fixed shapes
    if h.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if h.compile:
        compile_layers(model, static_shapes=static)
    net = TokenLoss(model, h.loss_chunk_tokens, compile_loss=h.compile, static_shapes=static)
    if not arm.is_ddp:
        return net, ExchangeHook()
    if h.gradient_as_bucket_view and not prebuilds_buckets(plan):
        # Gradients that exist when DDP is built become bucket views at once; left None, the
        # first update's no_sync micro-batches would accumulate into fresh tensors beside the
        # buckets (a second full gradient at the first update's peak). Where the buckets are
        # prebuilt, none exist yet: the prebuild's exchanging passes make every gradient a view
        # of its bucket before any micro-batch, with no second gradient beside the buckets.
        for param in model.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
    ddp = DDP(net, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=plan.powersgd.bucket_cap_mb,
              gradient_as_bucket_view=h.gradient_as_bucket_view)
    if prebuilds_buckets(plan):
        prebuild_buckets(ddp, plan.data.max_doc_tokens, model.get_input_embeddings().weight.shape[0])
        ddp.zero_grad(set_to_none=False)
    hook = arm.method.attach(ddp, arm, plan, device, fresh=register_hook)
    if register_hook:
        hook.register()
    return ddp, hook


class LimitStop(RuntimeError):
    """The study's deadline or budget (`gradshare.cost.limits`), or a tracking server gone past its
    grace time (`gradshare.tracking.outbox`), stopped the arm after a whole update."""


STOP_KINDS = (None, "deadline", "budget", "tracking")  # the all-reduced stop code is the index


def _cross_zone_bytes(wire: dict) -> float:
    """Bytes sent plus received by the arm's hosts so far, where there are several hosts."""
    return sum(h["wire_tx"] + h["wire_rx"] for h in wire.values()) if len(wire) > 1 else 0.0


def _host_inputs(plan: Plan, mbs: list[batching.MicroBatch], encoded, pad_id: int, device) -> list[dict]:
    """Each micro-batch's inputs, made on the host before the update's first forward."""
    if plan.schedule.micro_batch_tokens:
        return [batching.collate(mb, encoded, pad_id, pin=device.type == "cuda") for mb in mbs]
    out = []
    for mb in mbs:
        ids, att, tgt = collate([encoded[i] for i in mb.docs], pad_id, device)
        out.append({"ids": ids, "att": att, "tgt": tgt})
    return out


@dataclass
class TrainJob:
    """Everything one process is given to train one arm: the inputs (plan, arm, model, documents,
    schedule), where it runs (device, rank among world), and who listens (`on_step`, `log`,
    `limits`, `full_state`, `profile`, `heartbeat`, each optional). `train(job)` runs it.

    `on_step(update, metrics, docs_sha)` is called on rank 0 and may return a reason to stop
    after this update (`tracking: ...`), which every rank follows.

    `limits` (`gradshare.cost.limits.Limits`, rank 0's; None: no limits): after every update rank 0
    decides whether the next one may start, and every rank follows (one small all-reduce), so an
    arm stops after a whole update with `LimitStop`.

    `full_state`: save a full state every N updates, and/or continue from one: the weights and
    AdamW state are loaded, DDP makes one plain pass (its bucket rebuild, no update) before the
    kind's hook, restored from its saved state, is registered, each rank's RNG is restored, and
    the loop goes on from the next update with its running totals.

    `profile` (`gradshare.train.profiling`): one update profiled into a table.

    `heartbeat` (`gradshare.train.heartbeat.Heartbeat`): told of every completed update and of
    the full-state saves, so that the train step can tell a stopped or hung rank."""
    plan: Plan
    arm: str
    model: torch.nn.Module
    tokenizer: object
    docs: dict[str, dict]
    schedule: dict
    device: torch.device
    rank: int = 0
    world: int = 1
    on_step: Callable | None = None
    log: Callable = print
    limits: object = None
    full_state: FullStatePolicy | None = None
    profile: ProfileRequest | None = None
    heartbeat: object = None


class _Phase:
    """What the process is doing now, in words: an out-of-memory reason names it."""

    def __init__(self, now: str):
        self.now = now


class _Accounts:
    """Rank 0's books across updates: what the limits compare the next update with."""

    def __init__(self):
        self.slowest = 0.0  # the next update as slow as the slowest so far
        self.last_cross = 0.0


@dataclass
class _Arm:
    """One arm's training state in this process, set up once by `_set_up`: the job, what its
    updates use, and its running totals."""
    job: TrainJob
    arm: Arm
    phase: _Phase
    net: torch.nn.Module  # the token loss, in DDP for a DDP arm
    params: list
    opt: torch.optim.Optimizer
    hook: ExchangeHook  # the kind's hook on DDP (the base one: DDP's own all-reduce, or no DDP)
    steps: StaticSteps | None  # packed micro-batches' static steps, else None
    encoded: dict
    lengths: dict
    pad_id: int
    device: torch.device
    grads_to_none: bool
    autocast: object
    sync: Callable | None
    faults: object
    exchange: ExchangeBytes  # logical bytes of one rank's exchange, per update
    res: LoopResult = field(default_factory=LoopResult)
    books: _Accounts = field(default_factory=_Accounts)

    @property
    def plan(self) -> Plan:
        return self.job.plan

    @property
    def rank(self) -> int:
        return self.job.rank

    @property
    def world(self) -> int:
        return self.job.world


@dataclass
class _Update:
    """One update's outcome on this rank."""
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    wire_before: list
    wire_after: list
    # Further figures for the update's metrics, by the keys `M.PER_UPDATE` reads: a new one is a
    # key here, carried unchanged into `M.step_metrics`.
    values: dict = field(default_factory=dict)


def _accumulate_by_count(a: _Arm, inputs: list[dict], scale: float, local, where: str, between) -> None:
    """Micro-batches of whole documents, the last one through DDP's exchanging backward;
    `between()` after each one before the last."""
    for k, x in enumerate(inputs):
        a.phase.now = f"{where}, micro-batch {k + 1} of {len(inputs)} ({x['ids'].shape[0]} x {x['ids'].shape[1]} tokens)"
        last = k == len(inputs) - 1
        # Every DDP arm, whatever its world size: without no_sync a world-1 run would
        # exchange (and PowerSGD compress) after every micro-batch, 4 times per update.
        no_sync = a.net.no_sync() if (a.arm.is_ddp and not last) else contextlib.nullcontext()
        with no_sync:
            with a.autocast:  # the forward only; backward runs in the ops' own dtypes
                nll = a.net(x["ids"], x["att"], x["tgt"]).sum()
            # Sum of token losses over the global batch / its target count; DDP
            # averages over ranks, so each rank scales by world to undo it.
            (nll * scale).backward()
        local += torch.stack([nll.detach().double(), x["tgt"][:, 1:].sum().double(), x["att"].sum().double()])
        if not last:
            between()


def _accumulate_packed(a: _Arm, mbs, inputs: list[dict], scale: float, where: str, between) -> None:
    """Packed micro-batches through their static steps (graphs on a GPU), which only accumulate,
    `between()` after each; then a DDP arm's one exchange, a pass of its own (`TokenLoss` with no
    inputs)."""
    a.steps.begin_update(scale)
    for k, (mb, x) in enumerate(zip(mbs, inputs)):
        a.phase.now = f"{where}, micro-batch {k + 1} of {len(inputs)} ({mb.shape[0]} rows x {mb.shape[1]} tokens)"
        a.steps.run(x, mb.shape)
        between()
    if a.arm.is_ddp:
        a.phase.now = f"{where}, the gradient exchange"
        a.net(ids=None).backward()


def train(job: TrainJob) -> LoopResult:
    """Run every update of the job's schedule (`TrainJob` says what it is given and who listens).

    Out of device memory (under `hardware.max_device_gib` or the card's own), the arm ends with
    `DeviceMemoryError`, whose message names the cap, the update and what was being allocated."""
    phase = _Phase("start-up: the model, its compiled shapes and DDP's buckets")
    device = indexed(job.device)  # DDP's device_ids and the streams need the index
    # On a GPU everything from DDP's construction on runs on one stream of its own: a CUDA graph
    # is captured on a stream other than the default one, and the gradient accumulations DDP
    # creates at its construction run on the stream they were made on.
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(device))  # the model's initialisation
    try:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            return _train(_set_up(job, device, phase))
    except torch.OutOfMemoryError as exc:
        raise DeviceMemoryError(out_of_memory_reason(exc, job.plan.hardware.max_device_gib, phase.now,
                                                     device)) from None
    finally:
        if stream is not None:  # what follows (the checkpoint) reads the trained weights
            torch.cuda.current_stream(device).wait_stream(stream)


def _set_up(job: TrainJob, device: torch.device, phase: _Phase) -> _Arm:
    """The arm's model (in DDP, with its kind's hook), optimizer and encoded documents."""
    plan, model, arm = job.plan, job.model, job.plan.arm(job.arm)
    resume = job.full_state.resume if job.full_state else None
    packed = plan.schedule.micro_batch_tokens > 0
    o = plan.optim
    encoded = {i: encode(job.tokenizer, d, job.schedule["max_doc_tokens"]) for i, d in job.docs.items()}
    if resume:
        model.load_state_dict(resume["model"])
    params = [p for p in model.parameters() if p.requires_grad]
    # Static steps write into the gradients they saw at start-up: they must exist (a DDP arm's
    # come from its prebuilt buckets, `wrap_for_arm`).
    if packed and not (arm.is_ddp and prebuilds_buckets(plan)):
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    net, hook = wrap_for_arm(model, arm, plan, device, register_hook=resume is None)
    opt = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay, **({"fused": True} if plan.hardware.fused_adamw else {}))
    if resume:
        opt.load_state_dict(resume["optimizer"])
    shapes = [tuple(p.shape) for p in params]
    bf16 = plan.hardware.precision == "bf16-autocast"
    steps = None
    if packed:
        inner = net.module if arm.is_ddp else net
        steps = StaticSteps(inner, device, torch.bfloat16 if bf16 else None, plan.hardware.cuda_graphs,
                            model.get_input_embeddings().weight.shape[0], job.log)
    return _Arm(
        job=job, arm=arm, phase=phase, net=net, params=params, opt=opt, hook=hook, steps=steps,
        encoded=encoded, lengths={i: len(e[0]) for i, e in encoded.items()}, pad_id=job.tokenizer.pad_token_id,
        device=device,
        # Gradients that are DDP bucket views or graph inputs must stay where they are: zero them
        # in place. Set to None, the next micro-batches would accumulate into fresh tensors beside them.
        grads_to_none=not packed and not (arm.is_ddp and plan.hardware.gradient_as_bucket_view),
        autocast=torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext(),
        # The main stream only: a hook's copies on side streams (PowerSGD's error back to the host)
        # may run on into the next update, where they overlap its forward.
        sync=torch.cuda.current_stream(device).synchronize if device.type == "cuda" else None,
        faults=F.from_env(),
        exchange=exchange_bytes(plan, shapes))


def _restore(a: _Arm, resume: dict) -> int:
    """Continue from a full state: the running totals, DDP's first pass (its bucket rebuild, no
    update) before the hook is restored from its saved state and registered, each rank's RNG.
    Returns the first update to run."""
    first = resume["loop"]["update"] + 1
    for k in _TOTALS:
        setattr(a.res, k, resume["loop"][k])
    if a.arm.is_ddp and not prebuilds_buckets(a.plan):
        # DDP's first pass: pre-rebuild buckets, plain all-reduce, no update
        mine = rank_share(a.job.schedule["updates"][first - 1], a.rank, a.world)
        mb = micro_batches(a.plan, mine, a.lengths)[0]
        ids, att, tgt = collate([a.encoded[i] for i in mb.docs], a.pad_id, a.device)
        a.net(ids, att, tgt).sum().backward()
        a.opt.zero_grad(set_to_none=a.grads_to_none)
    if a.arm.is_ddp:
        a.hook.restore(resume["ranks"][a.rank]["hook"], a.device)
        a.hook.register()
    fullstate.set_rng_state(resume["ranks"][a.rank]["rng"])
    a.job.log(f"[{a.arm.name}] resumed after update {first - 1} (full state loaded in {resume.get('load_s', 0):.2f}s)")
    return first


def _update(a: _Arm, u: int, mine: list[str], n_global: int, where: str) -> _Update:
    """One update of this rank: the learning rate; its micro-batches, the last one through the
    update's one gradient exchange; the global loss; clip; AdamW's step; the gradients zeroed."""
    o, res = a.plan.optim, a.res
    mbs = micro_batches(a.plan, mine, a.lengths)
    for g in a.opt.param_groups:
        g["lr"] = _lr(a.plan, u)
    a.faults.update_start(u, a.rank)
    wire0 = gather(host_counters(), a.world)
    with Clock(a.sync) as clock:
        a.faults.during_update(a.rank)
        inputs = _host_inputs(a.plan, mbs, a.encoded, a.pad_id, a.device)
        res.error_prefetched_bytes += a.hook.before_micro_batches()  # PowerSGD: its host error goes up

        def between():
            res.error_prefetched_bytes += a.hook.between_micro_batches()
        # Sum of token losses over the global batch / its target count; DDP averages over
        # ranks, so each rank scales by world to undo it.
        scale = a.world / n_global
        if a.steps is not None:
            _accumulate_packed(a, mbs, inputs, scale, where, between)
            local = a.steps.local
        else:
            local = torch.zeros(3, dtype=torch.float64, device=a.device)  # loss sum, targets, tokens
            _accumulate_by_count(a, inputs, scale, local, where, between)
        if a.world > 1:
            dist.all_reduce(local)
        # Reads the loss back from the device: the step's one host sync.
        loss_sum, n_targets, n_tokens = local.tolist()
        if int(n_targets) != n_global:
            raise RuntimeError(f"update {u}: counted {int(n_targets)} target tokens, "
                               f"schedule registered {n_global}")
        loss = a.faults.loss(u, loss_sum / n_global)
        if not math.isfinite(loss):
            raise DivergenceError(f"training diverged: loss is {loss} at update {u} of arm {a.arm.name}")
        a.phase.now = f"{where}, the clip and the optimizer step"
        grad_norm = torch.nn.utils.clip_grad_norm_(a.params, o.clip_norm).item()
        if not math.isfinite(grad_norm):  # never let a non-finite gradient reach the weights
            raise DivergenceError(f"training diverged: gradient norm is {grad_norm} at update {u} "
                                  f"of arm {a.arm.name}")
        a.opt.step()
        a.opt.zero_grad(set_to_none=a.grads_to_none)
    return _Update(loss, grad_norm, int(n_tokens), clock.seconds, wire0, gather(host_counters(), a.world))


def _account(a: _Arm, u: int, out: _Update, update_docs: list[str], eta: float) -> tuple[str, str] | None:
    """The update's bytes and totals on every rank; on rank 0 its metrics, the limits' decision
    and the tracking's answer, and the progress line. Returns rank 0's reason to stop, if any."""
    res, books, job = a.res, a.books, a.job
    n_global, total = job.schedule["target_tokens"][u - 1], len(job.schedule["updates"])
    step_bytes = a.exchange.of(a.arm, u)
    res.losses.append(out.loss)
    res.active_s += out.seconds
    res.tokens += out.tokens
    res.logical_bytes += step_bytes
    if u > a.arm.warmup_updates:  # upstream's figure: no warm-up exchanges
        res.logical_bytes_post_warmup += step_bytes
    if a.rank != 0:
        return None
    stop = None
    hosts = per_host_delta(out.wire_before, out.wire_after)
    add_into(res.wire, hosts)
    metrics = M.step_metrics(out.values | dict(
        loss=out.loss, grad_norm=out.grad_norm, lr=_lr(a.plan, u), target_tokens=n_global, step_s=out.seconds,
        tokens=out.tokens, world=a.world, logical_bytes=step_bytes, hosts=hosts))
    if job.limits is not None:
        books.slowest = max(books.slowest, out.seconds)
        cross = _cross_zone_bytes(res.wire)
        now = time.time()
        metrics |= job.limits.step_metrics(now, cross) | {M.SPEND_CROSS_BYTES: cross}
        stop = job.limits.check(u, now, books.slowest, cross, next_cross_bytes=cross - books.last_cross)
        books.last_cross = cross
    if job.on_step:
        why = job.on_step(u, metrics, update_sha256(update_docs))
        stop = stop or (("tracking", why) if why else None)
    job.log(f"[{a.arm.name}] update {u:>4}/{total}  loss {out.loss:.4f}  grad_norm {out.grad_norm:.3f}  "
            f"{out.tokens / out.seconds:,.0f} tok/s  ETA {int(eta // 60)}m{int(eta % 60):02d}s")
    return stop


def _agree_to_stop(a: _Arm, stop: tuple[str, str] | None, u: int) -> None:
    """Every rank stops together after update `u`, or none does: rank 0's reason, all-reduced
    as its index in STOP_KINDS."""
    code = STOP_KINDS.index(stop[0] if stop else None)
    if a.world > 1:
        flag = torch.tensor([float(code)], device=a.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        code = int(flag.item())
    if code:
        kind = STOP_KINDS[code]
        raise LimitStop(stop[1] if stop else f"{kind}: stopped together with rank 0 after update {u}")


def _train(a: _Arm) -> LoopResult:
    """Restore, then every update: run it, account for it, save a full state where the policy
    says, and agree whether to stop."""
    job, res, full_state, heartbeat = a.job, a.res, a.job.full_state, a.job.heartbeat
    plan, schedule = job.plan, job.schedule
    a.net.train()
    first = _restore(a, full_state.resume) if full_state and full_state.resume else 1
    if a.steps is not None:
        a.phase.now = "start-up: compiling and capturing the micro-batch shapes"
        a.steps.prepare(batching.shapes(plan.data.max_doc_tokens, plan.schedule.micro_batch_tokens))
        a.opt.zero_grad(set_to_none=False)  # what the made-up start-up batches accumulated
        res.graphs = {"shapes": len(a.steps.buffers), "captured": len(a.steps.graphs), "failed": a.steps.failed}
    total = len(schedule["updates"])
    t_start = time.perf_counter()
    for u, update_docs in enumerate(schedule["updates"], start=1):
        if u < first:
            continue  # done before the full state this run resumed from
        if update_sha256(update_docs) != schedule["update_sha256"][u - 1]:
            raise RuntimeError(f"schedule entry {u} does not match its registered hash")
        where = f"update {u} of {total}"
        a.phase.now = where
        with profiled(job.profile, u, a.device):
            out = _update(a, u, rank_share(update_docs, a.rank, a.world), schedule["target_tokens"][u - 1], where)
        if u == first:
            res.wire_first = out.wire_before  # where the startup phase ends (metering)
        eta = (time.perf_counter() - t_start) / (u - first + 1) * (total - u)
        stop = _account(a, u, out, update_docs, eta)
        if heartbeat is not None:  # after rank 0 journaled the update's metrics: the same count
            heartbeat.progress(u)
        if full_state and full_state.saves_after(u, total):
            if heartbeat is not None:  # a save and its upload: no update bound fits them
                heartbeat.phase("full state")
            _save_full_state(full_state, u, a.arm.name, job.model, a.opt, a.hook, res, a.rank, a.world)
            if heartbeat is not None:
                heartbeat.phase("updates")
        _agree_to_stop(a, stop, u)
    res.hook_passes = a.hook.passes()
    return res
