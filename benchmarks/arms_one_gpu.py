"""Benchmark: every arm's gradient path on ONE GPU, the production loop beside a plain reference.

    python benchmarks/arms_one_gpu.py --updates 8 --out $OUT/results.json   # H200: ~6 minutes
    python benchmarks/arms_one_gpu.py --profile tiny --updates 5 --quick --out r.json  # CPU smoke
    python benchmarks/arms_one_gpu.py --log results.json --benchmarks-md BENCHMARKS.md
        # log a result file to MLflow ($MLFLOW_TRACKING_URI or sqlite:///mlflow.db) and
        # append its table to BENCHMARKS.md

What the anchors measure (DESIGN.md): Qwen3-1.7B shape (random weights), 32 documents
that each fill 512 tokens per update, AdamW on FP32 master weights, bf16 autocast, world
size 1 (DDP over a one-rank NCCL group: what the gradient path costs on the device,
without a network). In one call:
  - the bf16 matrix rate of this GPU (8192^3 products), the denominator of MFU;
  - a numerics check: gradshare's fast PowerSGD hook against upstream `powerSGD_hook`
    on the same gradients, on the GPU (the CPU test is tests/test_fast_path.py);
  - `gradshare.train.loop.train` (the production loop) for single, dense and powersgd
    (fast hook, host FP32 error; QR and CholeskyQR2) with the full profile's levers, and
    the same loop with every lever off (the plain path, as before the levers);
  - a plain reference loop (Hugging Face eager, fused AdamW, bucket views, upstream hook
    with device error), the baseline every figure is read against;
  - a profiler table of one compressed update of the fast powersgd arm and of single.
Medians are over updates 4 .. N-1 (update 1 compiles, 3 is the first compressed one and
allocates the pinned host error, N is profiled).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DOCS_PER_UPDATE = 32
DOC_TOKENS = 512
WARMUP = 2  # plain exchanges before compression (upstream start_powerSGD_iter)

# name -> (arm, plan overrides on top of the profile); "plain" is every lever off.
PLAIN = {"hardware.compile": "false", "hardware.fused_adamw": "false",
         "hardware.gradient_as_bucket_view": "false", "hardware.loss_chunk_tokens": "0",
         "powersgd.hook": "upstream", "powersgd.bucket_cap_mb": "25"}
CONFIGS = {
    "single": ("single", {}),
    "dense": ("dense", {}),
    "powersgd-fast-qr": ("powersgd", {"powersgd.orthogonalization": "qr"}),
    "powersgd-fast-cholqr2": ("powersgd", {"powersgd.orthogonalization": "cholesky-qr2"}),
    # what the 44 GiB goal costs: activation checkpointing; and the bucket size's share of the peak
    "dense-ckpt": ("dense", {"hardware.activation_checkpointing": "true"}),
    "powersgd-fast-qr-ckpt": ("powersgd", {"hardware.activation_checkpointing": "true"}),
    "dense-bucket25": ("dense", {"powersgd.bucket_cap_mb": "25"}),
    "plain-single": ("single", PLAIN),
    "plain-dense": ("dense", PLAIN),
    "plain-powersgd-host": ("powersgd", PLAIN),
}
REFERENCE = ("ref-single", "ref-dense", "ref-powersgd-upstream")
QUICK = ("single", "dense", "powersgd-fast-qr", "ref-single", "ref-powersgd-upstream")


def documents(n: int, seed: int) -> list[dict]:
    """Task documents long enough that each is cut at 512 tokens: every row of a micro-batch
    is full, 32 x 512 = 16,384 tokens per update, as in the anchors."""
    from gradshare.data.tasks import FAMILIES, generate_splits

    train, _ = generate_splits(FAMILIES, n * 6 // len(FAMILIES) + 1, 1, seed)
    docs = []
    for i in range(n):
        chunk = train[i * 6:(i + 1) * 6] or train[:6]
        text = "\n".join(f"{c['question']} {c['answer']}" for c in chunk) * 16
        docs.append({"id": f"doc/{i:05d}", "kind": "task", "family": None, "prompt": "", "target": text})
    return docs


def schedule_for(tokenizer, docs: dict, updates: int, seed: int) -> dict:
    from gradshare.data.documents import target_tokens
    from gradshare.data.schedule import build_schedule, update_sha256

    ids = build_schedule(sorted(docs), updates, DOCS_PER_UPDATE, seed)
    return {"updates": ids, "max_doc_tokens": DOC_TOKENS,
            "target_tokens": [sum(target_tokens(tokenizer, docs[i], DOC_TOKENS) for i in u) for u in ids],
            "update_sha256": [update_sha256(u) for u in ids]}


def plan_for(profile: str, updates: int, extra: dict):
    from gradshare.plan import load_plan

    n = updates * DOCS_PER_UPDATE
    over = {"schedule.updates": str(updates), "data.train_per_family": str((n - 4) // 4),
            "data.replay_docs": str(n - 4 * ((n - 4) // 4)), "powersgd.warmup_updates": str(WARMUP),
            "arms.dense_processes": "1", "arms.powersgd_processes": "1",
            "data.max_doc_tokens": str(DOC_TOKENS)}
    if profile != "full":  # CPU smoke: GPU levers off
        extra = {k: v for k, v in extra.items() if k not in ("hardware.compile", "hardware.fused_adamw")}
    return load_plan(profile, {**over, **extra})


class Profiled:
    """Profiles exactly update `at` of a loop, writes the device-time table, sums the copies."""

    def __init__(self, at: int, out: Path | None, cuda: bool):
        self.at, self.out, self.cuda, self.prof, self.copy_s = at, out, cuda, None, None

    def __call__(self, u: int) -> None:
        import torch

        if self.out is None:
            return
        if u == self.at - 1:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if self.cuda else [])
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
        elif u == self.at and self.prof is not None:
            self.prof.__exit__(None, None, None)
            avg = self.prof.key_averages()
            sort = "device_time_total" if self.cuda else "cpu_time_total"
            self.out.write_text(avg.table(sort_by=sort, row_limit=30))
            self.copy_s = sum(getattr(e, "device_time_total", 0) for e in avg
                              if e.key.startswith("Memcpy HtoD") or e.key.startswith("Memcpy DtoH")) / 1e6
            self.prof = None


def summarise(name: str, step_s: list[float], tokens: list[float], params: int, peak, losses, extra=None):
    post = step_s[3:-1] if len(step_s) > 5 else step_s[3:]
    med = statistics.median(post)
    tok = statistics.mean(tokens)
    return {"config": name, "step_s": step_s, "median_step_s": med, "tokens_per_update": tok,
            "tokens_per_s": tok / med, "params": params, "peak_gib": peak, "loss": losses, **(extra or {})}


def bench_loop(name: str, profile: str, updates: int, tokenizer, docs, device, trace_dir) -> dict:
    """`gradshare.train.loop.train`, unchanged, for one configuration."""
    import torch

    from gradshare.model import build_model, model_config
    from gradshare.sources import set_determinism
    from gradshare.train.loop import train

    arm, extra = CONFIGS[name]
    plan = plan_for(profile, updates, extra)
    set_determinism(plan.hardware.deterministic)
    docs = {d["id"]: d for d in docs[:updates * DOCS_PER_UPDATE]}
    schedule = schedule_for(tokenizer, docs, updates, plan.study.seed)
    cfg = model_config(plan.model.config) if profile == "full" else model_config(plan.model.config, len(tokenizer))
    model = build_model(cfg, plan.study.seed, device)
    params = sum(p.numel() for p in model.parameters())
    cuda = device.type == "cuda"
    start_gib = None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start_gib = torch.cuda.memory_allocated() / 2**30  # this model's weights, nothing left over
    traced = name in ("single", "dense", "powersgd-fast-qr", "powersgd-fast-cholqr2")
    prof = Profiled(updates, Path(trace_dir) / f"profile_{name}.txt" if (trace_dir and traced) else None, cuda)
    steps, peaks = [], []

    def on_step(u, m, _sha):
        steps.append(m)
        if cuda:  # the peak of each update, so that a one-off (compile, first compression) shows
            peaks.append(torch.cuda.max_memory_allocated() / 2**30)
            torch.cuda.reset_peak_memory_stats()
        prof(u)

    t0 = time.perf_counter()
    res = train(plan, arm, model, tokenizer, docs, schedule, device, 0, 1, on_step=on_step, log=lambda *a: None)
    from gradshare import metrics as M
    out = summarise(name, [m[M.STEP_S] for m in steps], [m[M.TOKENS_PER_S] * m[M.STEP_S] for m in steps],
                    params, max(peaks) if cuda else None, res.losses,
                    {"arm": arm, "overrides": extra, "wall_s": time.perf_counter() - t0, "peak_gib_per_update": peaks,
                     "start_gib": start_gib,
                     "logical_bytes_per_exchange": steps[-1][M.LOGICAL_BYTES],
                     "error_copy_gpu_s": prof.copy_s})
    del model, res
    _release(cuda)
    return out


def _release(cuda: bool) -> None:
    # DDP and its hooks form reference cycles: without a collection, an arm's model, buckets
    # and optimizer state stay allocated into the next arm and count in its peak (seen on
    # 2026-12-03: dense peaked 45.2 GiB after single, 40.4 GiB as the first arm).
    import gc

    import torch

    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def bench_reference(name: str, updates: int, tokenizer, docs, device, profile: str) -> dict:
    """A plain loop as a careful user would write it: HF eager model, logits -> FP32
    cross-entropy, fused AdamW, DDP with bucket views, upstream `powerSGD_hook` with its
    device-resident error. Same documents, micro-batches of 8, same normalisation."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradshare.data.documents import encode
    from gradshare.model import build_model, collate, model_config, token_losses

    cuda = device.type == "cuda"
    plan = plan_for(profile, updates, {})
    docs = {d["id"]: d for d in docs[:updates * DOCS_PER_UPDATE]}
    schedule = schedule_for(tokenizer, docs, updates, plan.study.seed)
    cfg = model_config(plan.model.config) if profile == "full" else model_config(plan.model.config, len(tokenizer))
    model = build_model(cfg, plan.study.seed, device)
    params = sum(p.numel() for p in model.parameters())
    net = model
    if name != "ref-single":
        net = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
        if name == "ref-powersgd-upstream":
            state = PowerSGDState(None, matrix_approximation_rank=plan.powersgd.rank, start_powerSGD_iter=WARMUP,
                                  use_error_feedback=True, warm_start=True, random_seed=plan.study.seed)
            net.register_comm_hook(state, powerSGD_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.optim.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    enc = {i: encode(tokenizer, d, DOC_TOKENS) for i, d in docs.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    step_s, tokens, losses = [], [], []
    mb = plan.schedule.micro_batch_docs
    for u, ids_u in enumerate(schedule["updates"]):
        t0 = time.perf_counter()
        for g in opt.param_groups:  # the study's linear warm-up, as in the loop
            g["lr"] = plan.optim.lr * min(1.0, (u + 1) / plan.optim.warmup_updates)
        n_tok, loss = 0, torch.zeros((), device=device)
        chunks = [ids_u[i:i + mb] for i in range(0, len(ids_u), mb)]
        for k, chunk in enumerate(chunks):
            ids, att, tgt = collate([enc[i] for i in chunk], tokenizer.pad_token_id, device)
            sync = contextlib.nullcontext() if (k == len(chunks) - 1 or net is model) else net.no_sync()
            with sync:
                with autocast:
                    nll = token_losses(net, ids, att, tgt).sum()
                (nll / schedule["target_tokens"][u]).backward()
            loss += nll.detach()
            n_tok += ids.numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=net is model)
        losses.append(loss.item() / schedule["target_tokens"][u])  # the host sync
        if cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        tokens.append(n_tok)
    out = summarise(name, step_s, tokens, params, torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                    losses, {"arm": name})
    del model, net, opt
    _release(cuda)
    if dist.is_initialized():
        dist.barrier()
    return out


def matmul_tflops(device) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def copy_gbps(device, gib: int = 2) -> dict | None:
    """Pinned host <-> GPU copy rates of this machine, GB/s: one direction, and both at once
    on two streams (the floor of moving the FP32 error)."""
    import torch

    if device.type != "cuda":
        return None
    n = gib * 2**30 // 4
    host = [torch.empty(n, pin_memory=True).fill_(1.0) for _ in range(2)]
    dev = [torch.empty(n, device=device) for _ in range(2)]
    streams = [torch.cuda.Stream(device) for _ in range(2)]

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def both():
        with torch.cuda.stream(streams[0]):
            dev[0].copy_(host[0], non_blocking=True)
        with torch.cuda.stream(streams[1]):
            host[1].copy_(dev[1], non_blocking=True)

    bytes_ = n * 4
    out = {"h2d": bytes_ / timed(lambda: dev[0].copy_(host[0], non_blocking=True)) / 1e9,
           "d2h": bytes_ / timed(lambda: host[1].copy_(dev[1], non_blocking=True)) / 1e9,
           "both": 2 * bytes_ / timed(both) / 1e9}
    del host, dev
    # The hook's pattern: 8 GB in 80 MB pieces, each its own pinned buffer, fresh ones
    # (never touched by the host, as torch.empty(pin_memory=True) gives them) and touched ones.
    k = 80 * 2**20 // 4
    src = [torch.empty(k, device=device) for _ in range(100)]
    for label, make in (("pieces_untouched", lambda: torch.empty(k, pin_memory=True)),
                        ("pieces_touched", lambda: torch.zeros(k, pin_memory=True))):
        hs = [make() for _ in range(100)]
        t0 = time.perf_counter()
        for h, d in zip(hs, src):
            h.copy_(d, non_blocking=True)
        torch.cuda.synchronize()
        out[label + "_d2h"] = 100 * k * 4 / (time.perf_counter() - t0) / 1e9
        t0 = time.perf_counter()
        for h, d in zip(hs, src):
            d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        out[label + "_h2d"] = 100 * k * 4 / (time.perf_counter() - t0) / 1e9
        del hs
    torch.cuda.empty_cache()
    return out


def numerics_check(device, exchanges: int = 6) -> dict:
    """The fast hook (QR, CholeskyQR2) against upstream `powerSGD_hook` on identical gradients:
    same weights, same batches, DDP over the one-rank group, plain SGD; matrices of the
    model's own shapes (several per bucket) in FP32. Relative L2 error of the communicated
    gradient at every exchange."""
    import torch
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradshare.train.powersgd import hook_for, make_powersgd_state

    d, f = (2048, 6144) if device.type == "cuda" else (128, 384)

    def model():
        torch.manual_seed(11)
        return nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, f), nn.Tanh(), nn.Linear(f, d), nn.Tanh(),
                             nn.Linear(d, d), nn.Tanh(), nn.Linear(d, f), nn.Tanh(), nn.Linear(f, d)).to(device)

    def run(variant):
        m = model()
        ddp = DDP(m, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=100)
        if variant == "upstream":
            st = PowerSGDState(None, matrix_approximation_rank=32, start_powerSGD_iter=WARMUP,
                               use_error_feedback=True, warm_start=True, random_seed=3)
            ddp.register_comm_hook(st, powerSGD_hook)
        else:
            st = make_powersgd_state(None, 32, WARMUP, True, "fp32-host", 2.0, 3, hook="fast",
                                     orthogonalization=variant)
            ddp.register_comm_hook(st, hook_for("fp32-host", "fast"))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator(device=device).manual_seed(5)
        out = []
        for _ in range(exchanges):
            x = torch.randn(512, d, device=device, generator=g)
            opt.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()
            out.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]).double().cpu())
            opt.step()
        return out

    up = run("upstream")
    res = {}
    for variant in ("qr", "cholesky-qr2"):
        got = run(variant)
        res[variant] = [float((a - b).norm() / b.norm()) for a, b in zip(got, up)]
    return res


def run(args) -> dict:
    import torch
    import torch.distributed as dist

    from gradshare.data.tokenizer import load_tokenizer, train_bpe

    cuda = torch.cuda.is_available() and args.profile == "full"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    docs = documents(args.updates * DOCS_PER_UPDATE, 7)
    tok_dir = Path(args.workdir) / "tokenizer"
    train_bpe([d["target"] for d in docs], 4096, tok_dir)
    tokenizer = load_tokenizer(tok_dir)
    commit = os.environ.get("GRADSHARE_COMMIT") or os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or None
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "commit": commit,
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "updates": args.updates}
    data = {"env": env, "matmul_tflops": matmul_tflops(device), "results": []}
    data["copy_gbps"] = copy_gbps(device)
    print(f"bf16 matmul: {data['matmul_tflops']} TFLOP/s; pinned copies GB/s: {data['copy_gbps']}", flush=True)
    data["numerics"] = numerics_check(device)
    _release(cuda)
    print("numerics (relative L2 vs upstream, per exchange):", json.dumps(data["numerics"]), flush=True)
    order = ("single", "dense", "powersgd-fast-qr", *REFERENCE, "powersgd-fast-cholqr2",
             "plain-single", "plain-powersgd-host", "plain-dense", "dense-ckpt",
             "powersgd-fast-qr-ckpt", "dense-bucket25")  # the essential ones first
    names = [n for n in order if not args.only or n in args.only.split(",")]
    if args.quick:
        names = [n for n in names if n in QUICK]
    for name in names:
        try:
            if name in CONFIGS:
                r = bench_loop(name, args.profile, args.updates, tokenizer, docs, device, out_path.parent)
            else:
                r = bench_reference(name, args.updates, tokenizer, docs, device, args.profile)
        except Exception as exc:  # one failed configuration must not lose the others
            import traceback
            traceback.print_exc()
            r = {"config": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
            if cuda:
                torch.cuda.empty_cache()
        data["results"].append(r)
        if "error" not in r:
            print(f"{name:<24} {r['median_step_s']:.3f} s/update  {r['tokens_per_s']:,.0f} tok/s  "
                  f"peak {r['peak_gib'] or 0:.1f} GiB  loss {r['loss'][-1]:.3f}  steps "
                  + " ".join(f"{s:.2f}" for s in r["step_s"])
                  + ("  peaks " + " ".join(f"{g:.1f}" for g in r["peak_gib_per_update"])
                     if r.get("peak_gib_per_update") else ""), flush=True)
        out_path.write_text(json.dumps(data, indent=1))  # after every configuration
    dist.destroy_process_group()
    return data


def flops_per_token(params: int, cfg: dict) -> float:
    """Training FLOPs per token: 6 N (every weight in a matrix product forward and twice
    backward; the tied embedding counted once, as the head's product) + causal attention
    6 L d T (QK^T and AV, fwd + bwd, half the square)."""
    return 6 * params + 6 * cfg["layers"] * cfg["attn_dim"] * DOC_TOKENS


QWEN3_1P7B = {"layers": 28, "attn_dim": 16 * 128}


def table_rows(data: dict) -> list[dict]:
    res = {r["config"]: r for r in data["results"] if "error" not in r}
    rate = data.get("matmul_tflops")
    rows = []
    for r in data["results"]:
        name = r["config"]
        if "error" in r:
            rows.append({"config": name, "error": r["error"]})
            continue
        fpt = flops_per_token(r["params"], QWEN3_1P7B)
        dense = {"powersgd-fast-qr": "dense", "powersgd-fast-cholqr2": "dense", "powersgd-fast-qr-ckpt": "dense-ckpt",
                 "plain-powersgd-host": "plain-dense", "ref-powersgd-upstream": "ref-dense"}.get(name)
        rows.append({"config": name, "step_s": r["median_step_s"], "tokens_per_s": r["tokens_per_s"],
                     "mfu": (fpt * r["tokens_per_s"] / 1e12 / rate) if rate else None,
                     "peak_gib": r["peak_gib"],
                     "extra_over_dense_s": (r["median_step_s"] - res[dense]["median_step_s"])
                     if dense in res else None,
                     "extra_peak_gib": (r["peak_gib"] - res[dense]["peak_gib"])
                     if dense in res and r["peak_gib"] is not None else None,
                     "error_copy_gpu_s": r.get("error_copy_gpu_s")})
    return rows


def markdown(data: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    e = data["env"]
    head = (f"### {e['date']} · {e['device']} · torch {e['torch']} (CUDA {e['cuda']}) · commit {e['commit']}\n\n"
            f"{e['updates']} updates per configuration, 32 x 512 tokens each; median of updates 4..{e['updates'] - 1}. "
            f"bf16 matrix rate measured in the same call: {f(data.get('matmul_tflops'), '.0f')} TFLOP/s "
            f"(the MFU denominator). Numerics, fast hook vs upstream `powerSGD_hook` on the same "
            f"gradients (relative L2, worst exchange): QR {f(max(data['numerics']['qr']), '.1e')}, "
            f"CholeskyQR2 {f(max(data['numerics']['cholesky-qr2']), '.1e')}. Pinned host copies measured in the "
            f"same call, GB/s: {', '.join(f'{k} {v:.1f}' for k, v in (data.get('copy_gbps') or {}).items()) or '-'}.\n\n")
    lines = ["| configuration | s/update | tokens/s | MFU | peak GiB | PowerSGD extra over its dense, s (GiB) "
             "| error copies, GPU s/update (side streams) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in table_rows(data):
        if "error" in r:
            lines.append(f"| {r['config']} | failed: {r['error'][:120]} | | | | | |")
            continue
        extra = "-" if r["extra_over_dense_s"] is None else \
            f"{r['extra_over_dense_s']:+.3f} ({f(r['extra_peak_gib'], '+.1f')})"
        lines.append(f"| {r['config']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {f(r['mfu'], '.0%')} "
                     f"| {f(r['peak_gib'], '.1f')} | {extra} | {f(r['error_copy_gpu_s'], '.3f')} |")
    return head + "\n".join(lines) + "\n"


def log_to_mlflow(path: Path, experiment: str) -> str:
    import mlflow

    from gradshare import metrics as M

    data = json.loads(path.read_text())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"arms-one-gpu-{data['env']['device']}") as run:
        mlflow.set_tags({"gradshare.step": "benchmark", **{f"env.{k}": str(v) for k, v in data["env"].items()}})
        if data.get("matmul_tflops"):
            mlflow.log_metric(M.BENCH_MATMUL_TFLOPS, data["matmul_tflops"])
        for r in table_rows(data):
            if "error" in r:
                continue
            mlflow.log_metrics({M.bench(r["config"], k): r[k] for k in M.BENCH_FIGURES if r.get(k) is not None})
        mlflow.log_text(markdown(data), "table.md")
        mlflow.log_dict(data, "results.json")
        return run.info.run_id


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="full")
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--out", default="arms_one_gpu.json")
    ap.add_argument("--workdir", default="/tmp/gradshare-bench")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--quick", action="store_true", help="only " + ", ".join(QUICK))
    ap.add_argument("--log", help="log this result file to MLflow instead of running")
    ap.add_argument("--benchmarks-md", help="with --log: append the table to this file")
    ap.add_argument("--experiment", default="gradshare-benchmarks")
    args = ap.parse_args(argv)
    if args.updates < 5:  # update 1 compiles, 3 starts compression, the last is profiled
        ap.error("--updates must be at least 5")
    if args.log:
        data = json.loads(Path(args.log).read_text())
        run_id = log_to_mlflow(Path(args.log), args.experiment)
        md = markdown(data)
        if args.benchmarks_md:
            with open(args.benchmarks_md, "a") as fh:
                fh.write("\n" + md + f"\nMLflow: experiment `{args.experiment}`, run `{run_id}`.\n")
        print(md)
        return
    data = run(args)
    print(markdown(data))


if __name__ == "__main__":
    main()
