"""The one training loop of every arm.

The arms differ only in how the gradient is communicated:
  single    one process, 32 documents per update by gradient accumulation
  dense     DDP, plain all-reduce of the full gradient
  powersgd  DDP with the PowerSGD hook (host-resident FP32 error feedback)
Everything else — seed, schedule, global target normalisation, clipping, AdamW — is
the same code path. Run by `gradshare.train.worker` under `accelerate launch`.

An update reads top to bottom: learning rate; micro-batches under `no_sync` until
the last (so exactly one gradient exchange per update); the global loss; clip; step;
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

from gradshare import faults as F
from gradshare import metrics as M
from gradshare.data.documents import encode
from gradshare.data.schedule import rank_share, update_sha256
from gradshare.metering import Clock, add_into, gather, host_counters, per_host_delta
from gradshare.model import TokenLoss, collate, compile_layers
from gradshare.plan import Plan
from gradshare.train import fullstate
from gradshare.train.powersgd import hook_for, logical_bytes_per_exchange, make_powersgd_state


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
    hook_passes: int | None = None  # PowerSGD state's exchange count: one per update


@dataclass
class FullState:
    """Full-state checkpoints of one arm (`gradshare.train.fullstate`)."""
    every: int = 0
    """Save after every `every`-th update but the last; 0: never."""
    root: Path | None = None
    """Where rank 0 writes them."""
    on_saved: Callable | None = None
    """Rank 0, after each save: on_saved(path, manifest)."""
    resume: dict | None = None
    """A loaded full state (`fullstate.load`) to continue from."""


_TOTALS = ("losses", "active_s", "tokens", "logical_bytes", "logical_bytes_post_warmup", "wire")


def _save_full_state(fs: FullState, u: int, arm: str, model, opt, psgd_state, res: "LoopResult",
                     rank: int, world: int) -> None:
    """Every rank's RNG and PowerSGD state to rank 0, which writes the whole state atomically."""
    mine = {"rng": fullstate.rng_state(), "powersgd": fullstate.powersgd_state(psgd_state)}
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


def micro_batches(doc_ids: list[str], lengths: dict[str, int], size: int) -> list[list[str]]:
    """This rank's share in micro-batches, grouped by length to waste little padding.

    The update's gradient is a sum over its documents, so grouping changes rounding
    only, never the function being computed.
    """
    ordered = sorted(doc_ids, key=lambda i: (lengths[i], i))
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


def wrap_for_arm(model, arm: str, plan: Plan, device: torch.device, register_hook: bool = True):
    """The model with its token loss (`TokenLoss`); `single`: as is, `dense`/`powersgd`: in DDP,
    with the PowerSGD hook for the latter. The plan's hardware levers are applied here, in
    one place, and each computes the same function as the plain path. `register_hook=False`:
    the PowerSGD state is made but not registered (resume registers it after a plain pass)."""
    h = plan.hardware
    if h.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if h.compile:
        compile_layers(model)
    net = TokenLoss(model, h.loss_chunk_tokens, compile_loss=h.compile)
    if arm == "single":
        return net, None
    from torch.nn.parallel import DistributedDataParallel as DDP

    if h.gradient_as_bucket_view:
        # Gradients that exist when DDP is built become bucket views at once; left None, the
        # first update's no_sync micro-batches would accumulate into fresh tensors beside the
        # buckets (a second full gradient at the first update's peak).
        for param in model.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
    ddp = DDP(net, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=plan.powersgd.bucket_cap_mb,
              gradient_as_bucket_view=h.gradient_as_bucket_view)
    state = None
    if arm == "powersgd":
        p = plan.powersgd
        state = make_powersgd_state(dist.group.WORLD, p.rank, p.warmup_updates, p.warm_start,
                                    p.error_feedback, p.min_compression_rate, plan.study.seed,
                                    hook=p.hook, orthogonalization=p.orthogonalization,
                                    staging_mb=p.staging_mb)
        if register_hook:
            ddp.register_comm_hook(state, hook_for(p.error_feedback, p.hook))
    return ddp, state


class LimitStop(RuntimeError):
    """The study's deadline or budget (`gradshare.limits`), or a tracking server gone past its
    grace time (`gradshare.outbox`), stopped the arm after a whole update."""


STOP_KINDS = (None, "deadline", "budget", "tracking")  # the all-reduced stop code is the index


def _cross_zone_bytes(wire: dict) -> float:
    """Bytes sent plus received by the arm's hosts so far, where there are several hosts."""
    return sum(h["wire_tx"] + h["wire_rx"] for h in wire.values()) if len(wire) > 1 else 0.0


def train(plan: Plan, arm: str, model, tokenizer, docs: dict[str, dict], schedule: dict,
          device: torch.device, rank: int, world: int, on_step=None, log=print, limits=None,
          full_state: FullState | None = None) -> LoopResult:
    """Run every update of the schedule; `on_step(update, metrics, docs_sha)` is called on rank 0
    and may return a reason to stop after this update (`tracking: ...`), which every rank follows.

    `limits` (`gradshare.limits.Limits`, rank 0's; None: no limits): after every update rank 0
    decides whether the next one may start, and every rank follows (one small all-reduce),
    so an arm stops after a whole update with `LimitStop`.

    `full_state`: save a full state every N updates, and/or continue from one: the weights and
    AdamW state are loaded, DDP makes one plain pass (its bucket rebuild, no update) before
    the restored PowerSGD state is registered, each rank's RNG is restored, and the loop
    goes on from the next update with its running totals."""
    s, o = plan.schedule, plan.optim
    max_tok = schedule["max_doc_tokens"]
    encoded = {i: encode(tokenizer, d, max_tok) for i, d in docs.items()}
    lengths = {i: len(e[0]) for i, e in encoded.items()}
    resume = full_state.resume if full_state else None
    if resume:
        model.load_state_dict(resume["model"])
    net, psgd_state = wrap_for_arm(model, arm, plan, device, register_hook=resume is None)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay, **({"fused": True} if plan.hardware.fused_adamw else {}))
    if resume:
        opt.load_state_dict(resume["optimizer"])
    # Gradients that are DDP bucket views must stay views: zero them in place. Set to None,
    # the next micro-batches would accumulate into fresh tensors beside the buckets.
    grads_to_none = not (arm != "single" and plan.hardware.gradient_as_bucket_view)
    shapes = [tuple(p.shape) for p in params]
    dense_bytes = logical_bytes_per_exchange(shapes, 4, None)
    psgd_bytes = logical_bytes_per_exchange(shapes, 4, plan.powersgd.rank, plan.powersgd.min_compression_rate)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if plan.hardware.precision == "bf16-autocast"
                else contextlib.nullcontext())
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    faults = F.from_env()
    res = LoopResult()
    slowest, last_cross = 0.0, 0.0  # for the limits: the next update as slow as the slowest so far
    first = 1
    net.train()
    if resume:
        first = resume["loop"]["update"] + 1
        for k in _TOTALS:
            setattr(res, k, resume["loop"][k])
        if arm != "single":  # DDP's first pass: pre-rebuild buckets, plain all-reduce, no update
            mine = rank_share(schedule["updates"][first - 1], rank, world)
            mb = micro_batches(mine, lengths, s.micro_batch_docs)[0]
            ids, att, tgt = collate([encoded[i] for i in mb], tokenizer.pad_token_id, device)
            net(ids, att, tgt).sum().backward()
            opt.zero_grad(set_to_none=grads_to_none)
            if psgd_state is not None:
                fullstate.restore_powersgd_state(psgd_state, resume["ranks"][rank]["powersgd"], device=device)
                net.register_comm_hook(psgd_state, hook_for(plan.powersgd.error_feedback, plan.powersgd.hook))
        fullstate.set_rng_state(resume["ranks"][rank]["rng"])
        log(f"[{arm}] resumed after update {first - 1} (full state loaded in {resume.get('load_s', 0):.2f}s)")
    t_start = time.perf_counter()
    for u, update_docs in enumerate(schedule["updates"], start=1):
        if u < first:
            continue  # done before the full state this run resumed from
        if update_sha256(update_docs) != schedule["update_sha256"][u - 1]:
            raise RuntimeError(f"schedule entry {u} does not match its registered hash")
        n_global = schedule["target_tokens"][u - 1]
        mine = rank_share(update_docs, rank, world)
        mbs = micro_batches(mine, lengths, s.micro_batch_docs)
        for g in opt.param_groups:
            g["lr"] = _lr(plan, u)
        faults.update_start(u, rank)
        wire0 = gather(host_counters(), world)
        if u == first:
            res.wire_first = wire0  # where the startup phase ends (metering)
        with Clock(sync) as clock:
            faults.during_update(rank)
            local = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, targets, tokens
            for k, mb in enumerate(mbs):
                ids, att, tgt = collate([encoded[i] for i in mb], tokenizer.pad_token_id, device)
                last = k == len(mbs) - 1
                # Every DDP arm, whatever its world size: without no_sync a world-1 run would
                # exchange (and PowerSGD compress) after every micro-batch, 4 times per update.
                no_sync = net.no_sync() if (arm != "single" and not last) else contextlib.nullcontext()
                with no_sync:
                    with autocast:  # the forward only; backward runs in the ops' own dtypes
                        nll = net(ids, att, tgt).sum()
                    # Sum of token losses over the global batch / its target count; DDP
                    # averages over ranks, so each rank scales by world to undo it.
                    (nll * (world / n_global)).backward()
                local += torch.stack([nll.detach().double(), tgt[:, 1:].sum().double(),
                                      att.sum().double()])
            if world > 1:
                dist.all_reduce(local)
            # Reads the loss back from the device: the step's one host sync.
            loss_sum, n_targets, n_tokens = local.tolist()
            if int(n_targets) != n_global:
                raise RuntimeError(f"update {u}: counted {int(n_targets)} target tokens, "
                                   f"schedule registered {n_global}")
            loss = loss_sum / n_global
            loss = faults.loss(u, loss)
            if not math.isfinite(loss):
                raise DivergenceError(f"training diverged: loss is {loss} at update {u} of arm {arm}")
            grad_norm = torch.nn.utils.clip_grad_norm_(params, o.clip_norm).item()
            if not math.isfinite(grad_norm):  # never let a non-finite gradient reach the weights
                raise DivergenceError(f"training diverged: gradient norm is {grad_norm} at update {u} "
                                      f"of arm {arm}")
            opt.step()
            opt.zero_grad(set_to_none=grads_to_none)
        wire1 = gather(host_counters(), world)
        compressed = arm == "powersgd" and u > plan.powersgd.warmup_updates
        step_bytes = 0 if arm == "single" else (psgd_bytes if compressed else dense_bytes)
        res.losses.append(loss)
        res.active_s += clock.seconds
        res.tokens += int(n_tokens)
        res.logical_bytes += step_bytes
        if compressed or arm == "dense":  # upstream's figure: no warm-up exchanges
            res.logical_bytes_post_warmup += step_bytes
        stop = None
        if rank == 0:
            hosts = per_host_delta(wire0, wire1)
            add_into(res.wire, hosts)
            metrics = M.step_metrics(loss=loss, grad_norm=grad_norm, lr=_lr(plan, u), target_tokens=n_global,
                                     step_s=clock.seconds, tokens=n_tokens, world=world,
                                     logical_bytes=step_bytes, hosts=hosts)
            if limits is not None:
                slowest = max(slowest, clock.seconds)
                cross = _cross_zone_bytes(res.wire)
                now = time.time()
                metrics |= limits.step_metrics(now, cross) | {M.SPEND_CROSS_BYTES: cross}
                stop = limits.check(u, now, slowest, cross, next_cross_bytes=cross - last_cross)
                last_cross = cross
            if on_step:
                why = on_step(u, metrics, update_sha256(update_docs))
                stop = stop or (("tracking", why) if why else None)
            elapsed = time.perf_counter() - t_start
            eta = elapsed / (u - first + 1) * (len(schedule["updates"]) - u)
            log(f"[{arm}] update {u:>4}/{len(schedule['updates'])}  loss {loss:.4f}  "
                f"grad_norm {grad_norm:.3f}  {n_tokens / clock.seconds:,.0f} tok/s  "
                f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")
        if full_state and full_state.every and u % full_state.every == 0 and u < len(schedule["updates"]):
            _save_full_state(full_state, u, arm, model, opt, psgd_state, res, rank, world)
        code = STOP_KINDS.index(stop[0] if stop else None)
        if world > 1:  # every rank stops together, or none does
            flag = torch.tensor([float(code)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            code = int(flag.item())
        if code:
            kind = STOP_KINDS[code]
            raise LimitStop(stop[1] if stop else f"{kind}: stopped together with rank 0 after update {u}")
    res.hook_passes = psgd_state.iter if psgd_state is not None else None
    return res
