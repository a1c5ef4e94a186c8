"""One GPU benchmark configuration, in a process of its own (started by `benchmarks/gpu_path.py`):

    python benchmarks/gpu_configs.py --one single --workdir /tmp/gp --updates 16 --out single.json
    python benchmarks/gpu_configs.py --one calibrate --workdir /tmp/gp --out calibrate.json

A configuration is a workload (`benchmarks/workloads.py`), an arm and plan overrides on top of
the full profile, run through the production loop (`gradshare.train.loop.train`) at world size
1 (DDP over a one-rank NCCL group: what the gradient path costs on the device, without a
network), under the allocator cap the worker applies (`gradshare.train.memory`). It reports
every update's seconds, tokens, peak memory (allocated and reserved) and the dynamo compile
counters after it, the start-up seconds, the graphs captured, and a profiler table of the last
update where asked. `ref-*` is a plain loop as a careful user would write it (Hugging Face
eager model, logits -> FP32 cross-entropy, fused AdamW, 8 documents per micro-batch in
schedule order), the baseline every figure is read against. `calibrate` measures the card:
its bf16 matrix rate, its pinned host copy rates, and the fast PowerSGD hook against
upstream's on the same gradients (with and without the early fetch of the host error).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import workloads  # noqa: E402
from gradshare.kinds.powersgd import PowerSGD  # noqa: E402

BY_COUNT = {"schedule.micro_batch_tokens": "0", "hardware.cuda_graphs": "false"}  # the landed loop
# --smoke: the same configurations on a CPU, with the tiny model and the full profile's levers
# that a CPU has (packing, static steps, bucket views, the fast hook): the harness checked
# before a GPU call is spent on it (tests/e2e/test_gpu_path_smoke.py).
SMOKE = {"schedule.micro_batch_tokens": "2048", "hardware.cuda_graphs": "true", "hardware.loss_chunk_tokens": "2048",
         "hardware.gradient_as_bucket_view": "true", "powersgd.hook": "fast", "powersgd.bucket_cap_mb": "1",
         "hardware.threads_per_process": "0"}
NO_GRAPHS = {"hardware.cuda_graphs": "false"}
PROFILED = {"single", "powersgd", "single-512", "powersgd-512", "powersgd-cholqr2", "powersgd-512-cholqr2",
            "powersgd-rank-8", "powersgd-fold", "powersgd-512-fold", "powersgd-fold-rank-8"}

# name -> (workload, arm, overrides on top of the full profile); ref-* are the plain loop.
CONFIGS = {
    "single": ("study", "single", {}),
    "dense": ("study", "dense", {}),
    "powersgd": ("study", "powersgd", {}),
    "single-no-graphs": ("study", "single", NO_GRAPHS),
    "single-by-count": ("study", "single", BY_COUNT),
    "powersgd-by-count": ("study", "powersgd", BY_COUNT),
    "single-4096": ("study", "single", {"schedule.micro_batch_tokens": "4096"}),
    "powersgd-4096": ("study", "powersgd", {"schedule.micro_batch_tokens": "4096"}),
    "single-512-4096": ("stand-in-512", "single", {"schedule.micro_batch_tokens": "4096"}),
    "powersgd-staging-2048": ("study", "powersgd", {"powersgd.staging_mb": "2048"}),
    "powersgd-cholqr2": ("study", "powersgd", {"powersgd.orthogonalization": "cholesky-qr2"}),
    "powersgd-cholqr2-staging-2048": ("study", "powersgd", {"powersgd.orthogonalization": "cholesky-qr2",
                                                            "powersgd.staging_mb": "2048"}),
    "powersgd-512-cholqr2-staging-2048": ("stand-in-512", "powersgd", {"powersgd.orthogonalization": "cholesky-qr2",
                                                                       "powersgd.staging_mb": "2048"}),
    "ref-single": ("study", "ref-single", {}),
    "ref-dense": ("study", "ref-dense", {}),
    "single-512": ("stand-in-512", "single", {}),
    "dense-512": ("stand-in-512", "dense", {}),
    "powersgd-512": ("stand-in-512", "powersgd", {}),
    "powersgd-512-cholqr2": ("stand-in-512", "powersgd", {"powersgd.orthogonalization": "cholesky-qr2"}),
    "powersgd-rank-8": ("study", "powersgd", {"powersgd.rank": "8"}),
    "powersgd-fold": ("study", "powersgd", {"powersgd.fold_errors": "true"}),
    "powersgd-512-fold": ("stand-in-512", "powersgd", {"powersgd.fold_errors": "true"}),
    "powersgd-fold-rank-8": ("study", "powersgd", {"powersgd.fold_errors": "true", "powersgd.rank": "8"}),
    "single-512-by-count": ("stand-in-512", "single", BY_COUNT),
    "ref-single-512": ("stand-in-512", "ref-single", {}),
    # the cap-and-reason path the worker uses, under a cap the arm cannot fit
    "single-cap-30": ("study", "single", {"hardware.max_device_gib": "30"}),
}


def _plan(extra: dict, smoke: bool):
    return workloads.bench_plan("tiny", {**SMOKE, **extra}) if smoke else workloads.bench_plan("full", extra)


def _model(plan, tokenizer, device):
    from gradshare.model.lm import build_model
    from gradshare.model.source import model_config

    vocab = len(tokenizer) if plan.model.config == "tiny_qwen3.json" else None
    return build_model(model_config(plan.model.config, vocab), plan.study.seed, device)


def _peaks(device) -> dict:
    import torch

    if device.type != "cuda":
        return {"allocated_gib": 0.0, "reserved_gib": 0.0}
    out = {"allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
           "reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
           # the allocator freed its cache and tried again (a full synchronize each): memory at the cap
           "alloc_retries": int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))}
    torch.cuda.reset_peak_memory_stats(device)
    return out


def _compiles() -> int:
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])  # frames compiled so far (first compiles and recompiles)


def write_streams(prof, path: Path) -> None:
    """The profiled update's device work as intervals per CUDA stream (kernels and copies): what
    `benchmarks/overlap_figure.py` draws, to show whether the error's copies run beside compute."""
    rows = []
    for e in prof.profiler.kineto_results.events():
        if str(e.device_type()).endswith("CUDA") and e.duration_ns() > 0:
            name = e.name()
            kind = ("h2d" if "HtoD" in name else "d2h" if "DtoH" in name else
                    "copy" if name.startswith("Memcpy") or name.startswith("Memset") else "kernel")
            rows.append([e.device_resource_id(), kind, e.start_ns() // 1000, max(1, e.duration_ns() // 1000),
                         name[:60]])
    path.write_text(json.dumps({"unit": "us", "columns": ["stream", "kind", "start", "duration", "name"],
                                "rows": rows}))


def write_memory(path: Path) -> None:
    """Where the device memory is at the end of the profiled update: the allocator's segments by
    pool (the CUDA graphs' private pool apart from the rest), reserved and in use, and the largest
    blocks in use outside the graphs' pool; what the staging of the error can be given."""
    import torch

    pools: dict[str, dict[str, float]] = {}
    blocks = []
    for seg in torch.cuda.memory_snapshot():
        pool = "graphs" if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0) else "default"
        p = pools.setdefault(pool, {"reserved_gib": 0.0, "active_gib": 0.0, "segments": 0})
        p["reserved_gib"] += seg["total_size"] / 2**30
        p["active_gib"] += seg.get("active_size", seg["allocated_size"]) / 2**30
        p["segments"] += 1
        if pool == "default":
            blocks += [b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    blocks.sort(reverse=True)
    path.write_text(json.dumps({"pools": pools, "largest_active_default_mib": [round(b / 2**20, 1) for b in blocks[:40]],
                                "active_default_blocks": len(blocks)}, indent=1))


class Profiled:
    """Profiles exactly update `at` of a loop and keeps its table and host/device totals."""

    def __init__(self, at: int, out: Path | None):
        self.at, self.out, self.prof, self.totals = at, out, None, None

    def __call__(self, u: int) -> None:
        import torch

        if self.out is None:
            return
        if u == self.at - 1:
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
        elif u == self.at and self.prof is not None:
            self.prof.__exit__(None, None, None)
            from gradshare.kinds.powersgd_hook import COMPRESSION

            avg = self.prof.key_averages()
            self.out.write_text(avg.table(sort_by="device_time_total", row_limit=30))
            copies = [e for e in avg if e.key.startswith(("Memcpy HtoD", "Memcpy DtoH"))]
            for write, name in ((lambda p: write_streams(self.prof, p), "streams_"), (write_memory, "memory_")):
                path = self.out.with_name(self.out.name.replace("profile_", name).replace(".txt", ".json"))
                try:  # a figure's side file never costs the configuration its figures
                    write(path)
                except Exception as exc:
                    path.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            self.totals = {"host_self_s": sum(e.self_cpu_time_total for e in avg) / 1e6,
                           "device_self_s": sum(getattr(e, "self_device_time_total", 0) for e in avg) / 1e6,
                           "copy_device_s": sum(getattr(e, "device_time_total", 0) for e in copies) / 1e6,
                           # the fast hook's compression (its record_function), kernels included, and
                           # the orthogonalisation calls: how many launches batching saved
                           "compression_device_s": sum(getattr(e, "device_time_total", 0) for e in avg
                                                       if e.key == COMPRESSION) / 1e6,
                           "orthogonalisation_calls": sum(e.count for e in avg if e.key in (
                               "aten::linalg_qr", "aten::linalg_cholesky_ex"))}
            self.prof = None


def bench_loop(name: str, workdir: Path, updates: int, device, out_dir: Path | None, smoke: bool = False) -> dict:
    """`gradshare.train.loop.train`, unchanged, for one configuration."""
    from gradshare.contract import metrics as M
    from gradshare.util.sources import set_determinism
    from gradshare.train.loop import TrainJob, train
    from gradshare.train.memory import DeviceMemoryError, cap_device_memory

    workload, arm, extra = CONFIGS[name]
    plan = _plan(extra, smoke)
    set_determinism(plan.hardware.deterministic, compiles=plan.hardware.compile)
    fraction = cap_device_memory(plan.hardware.max_device_gib, device)  # the worker's own cap
    docs, tokenizer, schedule = workloads.load(workload, workdir, updates)
    model = _model(plan, tokenizer, device)
    params = sum(p.numel() for p in model.parameters())
    _peaks(device)  # from here
    profiled = out_dir and name in PROFILED and device.type == "cuda"
    prof = Profiled(updates, out_dir / f"profile_{name}.txt" if profiled else None)
    rows = []
    compiles0 = _compiles()
    t0 = time.perf_counter()

    def on_step(u, m, _sha):
        rows.append({"update": u, "step_s": m[M.STEP_S], "tokens": m[M.TOKENS_PER_S] * m[M.STEP_S],
                     "loss": m["train/loss"], "compiles": _compiles() - compiles0, **_peaks(device),
                     "at_s": time.perf_counter() - t0})
        prof(u)

    out = {"config": name, "workload": workload, "arm": arm, "overrides": extra, "params": params, "smoke": smoke,
           "cap_gib": plan.hardware.max_device_gib, "cap_fraction": fraction}
    try:
        res = train(TrainJob(plan, arm, model, tokenizer, docs, schedule, device, 0, 1, on_step=on_step, log=lambda *a: None))
        out.update(graphs=res.graphs, error_prefetched_bytes=res.error_prefetched_bytes)
        if isinstance(plan.arm(arm).method, PowerSGD):  # the calibration's copy_overlap: how its hook moved the error
            from gradshare.kinds.powersgd_hook import COPY_OVERLAP

            out["copy_overlap"] = COPY_OVERLAP if plan.powersgd.fold_errors else "none"
    except DeviceMemoryError as exc:  # the reason the worker would record
        out["failure_reason"] = str(exc)
    out.update(rows=rows, wall_s=time.perf_counter() - t0, profile=prof.totals,
               startup_s=(rows[0]["at_s"] - rows[0]["step_s"]) if rows else None)
    return out


def bench_reference(name: str, workdir: Path, updates: int, device, smoke: bool = False) -> dict:
    """The plain loop: HF eager model, logits -> FP32 cross-entropy, fused AdamW, DDP with bucket
    views; 8 documents per micro-batch in schedule order, the study's normalisation."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradshare.data.documents import encode
    from gradshare.model.lm import collate, token_losses

    workload, arm, _ = CONFIGS[name]
    plan = _plan({}, smoke)
    cuda = device.type == "cuda"
    # No cap: a baseline, not an arm; its peak says whether it would fit the study's card.
    docs, tokenizer, schedule = workloads.load(workload, workdir, updates)
    model = _model(plan, tokenizer, device)
    net = model if arm == "ref-single" else DDP(model, device_ids=[device.index] if cuda else None,
                                                 gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.optim.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    enc = {i: encode(tokenizer, d, schedule["max_doc_tokens"]) for i, d in docs.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    _peaks(device)
    rows, mb = [], plan.schedule.micro_batch_docs
    t0 = time.perf_counter()
    for u, ids_u in enumerate(schedule["updates"], start=1):
        t_u = time.perf_counter()
        n_tok, loss = 0, torch.zeros((), device=device)
        chunks = [ids_u[i:i + mb] for i in range(0, len(ids_u), mb)]
        for k, chunk in enumerate(chunks):
            ids, att, tgt = collate([enc[i] for i in chunk], tokenizer.pad_token_id, device)
            sync = contextlib.nullcontext() if (k == len(chunks) - 1 or net is model) else net.no_sync()
            with sync:
                with autocast:
                    nll = token_losses(net, ids, att, tgt).sum()
                (nll / schedule["target_tokens"][u - 1]).backward()
            loss += nll.detach()
            n_tok += int(att.sum())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=net is model)
        value = loss.item() / schedule["target_tokens"][u - 1]  # the host sync
        if cuda:
            torch.cuda.synchronize()
        rows.append({"update": u, "step_s": time.perf_counter() - t_u, "tokens": n_tok, "loss": value,
                     **_peaks(device), "at_s": time.perf_counter() - t0})
    return {"config": name, "workload": workload, "arm": arm, "rows": rows, "wall_s": time.perf_counter() - t0,
            "params": sum(p.numel() for p in model.parameters()), "cap_gib": None}


def matmul_tflops(device) -> float:
    import torch

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


def device_copy_gbps(device, gib: int = 4) -> float:
    """Device memory bandwidth, GB/s, counting bytes read and written: a large device-to-device copy
    (the rate the projection scales memory-bound work by, `gradshare.cost.gpu_cost`)."""
    import torch

    n = gib * 2**30 // 4
    a, b = torch.randn(n, device=device), torch.empty(n, device=device)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n * 4 / statistics.median(times) / 1e9


def copy_gbps(device, gib: int = 2) -> dict:
    """Pinned host <-> GPU copy rates, GB/s: each direction, and both at once on two streams
    (the floor of moving the FP32 error both ways)."""
    import torch

    n = gib * 2**30 // 4
    host = [torch.empty(n, pin_memory=True).fill_(1.0) for _ in range(2)]
    dev = [torch.empty(n, device=device).fill_(2.0) for _ in range(2)]
    streams = [torch.cuda.Stream(device) for _ in range(2)]

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    def both():
        with torch.cuda.stream(streams[0]):
            dev[0].copy_(host[0], non_blocking=True)
        with torch.cuda.stream(streams[1]):
            host[1].copy_(dev[1], non_blocking=True)

    size = n * 4
    return {"h2d": size / timed(lambda: dev[0].copy_(host[0], non_blocking=True)) / 1e9,
            "d2h": size / timed(lambda: host[1].copy_(dev[1], non_blocking=True)) / 1e9,
            "both": 2 * size / timed(both) / 1e9}


def numerics_check(device, exchanges: int = 6) -> dict:
    """The fast hook (QR, CholeskyQR2, and QR with the host error fetched early) against upstream
    `powerSGD_hook` on identical gradients: same weights, same batches, DDP over the one-rank
    group, plain SGD, matrices of the model's own shapes in several buckets, FP32. Relative L2
    error of the communicated gradient at every exchange."""
    import torch
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradshare.kinds.powersgd_hook import hook_for, make_powersgd_state, prefetch_errors

    d, f = 2048, 6144

    def model():
        torch.manual_seed(11)
        return nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, f), nn.Tanh(), nn.Linear(f, d), nn.Tanh(),
                             nn.Linear(d, d), nn.Tanh(), nn.Linear(d, f), nn.Tanh(), nn.Linear(f, d)).to(device)

    def run(variant):
        m = model()
        ddp = DDP(m, device_ids=[device.index], bucket_cap_mb=100)
        if variant == "upstream":
            st = PowerSGDState(None, matrix_approximation_rank=32, start_powerSGD_iter=workloads.WARMUP,
                               use_error_feedback=True, warm_start=True, random_seed=3)
            ddp.register_comm_hook(st, powerSGD_hook)
        else:
            ortho = "cholesky-qr2" if variant == "cholesky-qr2" else "qr"
            staging = 64 if variant == "qr" else 1024  # "qr-early": the whole error fetched early
            st = make_powersgd_state(None, 32, workloads.WARMUP, True, "fp32-host", 2.0, 3, hook="fast",
                                     orthogonalization=ortho, staging_mb=staging)
            ddp.register_comm_hook(st, hook_for("fp32-host", "fast"))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator(device=device).manual_seed(5)
        out = []
        for _ in range(exchanges):
            x = torch.randn(512, d, device=device, generator=g)
            opt.zero_grad(set_to_none=True)
            if variant == "qr-early":
                prefetch_errors(st)
            ddp(x).square().mean().backward()
            out.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]).double().cpu())
            opt.step()
        return out

    up = run("upstream")
    return {v: [float((a - b).norm() / b.norm()) for a, b in zip(run(v), up)]
            for v in ("qr", "cholesky-qr2", "qr-early")}


def calibrate(device) -> dict:
    import torch

    if device.type != "cuda":
        return {"matmul_tflops": None, "device_copy_gbps": None, "copy_gbps": None, "numerics": None}
    out = {"matmul_tflops": matmul_tflops(device), "device_copy_gbps": device_copy_gbps(device)}
    torch.cuda.empty_cache()
    out["copy_gbps"] = copy_gbps(device)
    torch.cuda.empty_cache()
    out["numerics"] = numerics_check(device)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", required=True, help="calibrate, or one of: " + ", ".join(CONFIGS))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile-dir", default="")
    ap.add_argument("--smoke", action="store_true", help="a CPU, the tiny model: the harness, not the figures")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29517 + os.getpid() % 1000))
    dist.init_process_group("gloo" if args.smoke else "nccl", rank=0, world_size=1)
    try:
        if args.one == "calibrate":
            result = calibrate(device)
        elif CONFIGS[args.one][1].startswith("ref-"):
            result = bench_reference(args.one, Path(args.workdir), args.updates, device, args.smoke)
        else:
            result = bench_loop(args.one, Path(args.workdir), args.updates, device,
                                Path(args.profile_dir) if args.profile_dir else None, args.smoke)
    except Exception as exc:  # the orchestrator reports it beside the others
        traceback.print_exc()
        result = {"config": args.one, "error": f"{type(exc).__name__}: {exc}"[:800]}
    Path(args.out).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
