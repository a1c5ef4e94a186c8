"""Benchmark: the study's training loop for each arm's gradient path on ONE device.

    python benchmarks/arms_one_gpu.py --updates 12 --out results.json          # H200 / any GPU
    python benchmarks/arms_one_gpu.py --profile tiny --updates 6 --out r.json  # CPU smoke
    python benchmarks/arms_one_gpu.py --log results.json                       # log a result file to MLflow

Runs `gradshare.train.loop.train` — the production loop, unchanged — on a
Qwen3-1.7B-shaped model (random weights: throughput only) with 32 documents x 512
tokens per update, for: `single` (no exchange), `dense` (DDP, world size 1, plain
all-reduce), and `powersgd` with host-resident FP32 error feedback and with
upstream's device-resident error. World size 1 isolates what each gradient path
costs on the device (compression, error round trip) from the network, which the
two-GPU study measures. Prints a table; writes JSON; `--log` puts a result file
into MLflow as a benchmark run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def documents(n: int, seed: int) -> list[dict]:
    """Long task documents (several generated cases each) so that each fills ~512 tokens."""
    from gradshare.data.tasks import FAMILIES, generate_splits

    train, _ = generate_splits(FAMILIES, n * 6 // len(FAMILIES) + 1, 1, seed)
    docs = []
    for i in range(n):
        chunk = train[i * 6:(i + 1) * 6] or train[:6]
        text = "\n".join(f"{c['question']} {c['answer']}" for c in chunk) * 4
        docs.append({"id": f"doc/{i:05d}", "kind": "task", "family": None, "prompt": "", "target": text})
    return docs


def bench_arm(arm: str, error_feedback: str, profile: str, updates: int, tokenizer, docs, device,
              trace_update: int = 0, trace_out: Path | None = None) -> dict:
    import torch

    from gradshare.data.documents import target_tokens
    from gradshare.data.schedule import build_schedule, update_sha256
    from gradshare.model import build_model, model_config
    from gradshare.plan import load_plan
    from gradshare.sources import set_determinism
    from gradshare.train.loop import train

    n_docs = updates * 32
    over = {"schedule.updates": str(updates), "data.train_per_family": str((n_docs - 4) // 4),
            "data.replay_docs": str(n_docs - 4 * ((n_docs - 4) // 4)), "powersgd.warmup_updates": "2",
            "powersgd.error_feedback": error_feedback, "arms.dense_processes": "1",
            "arms.powersgd_processes": "1", "data.max_doc_tokens": "512"}
    plan = load_plan(profile, over)
    set_determinism(plan.hardware.deterministic)
    docs = {d["id"]: d for d in docs[:n_docs]}
    sched_ids = build_schedule(sorted(docs), updates, 32, plan.study.seed)
    schedule = {"updates": sched_ids, "max_doc_tokens": 512,
                "target_tokens": [sum(target_tokens(tokenizer, docs[i], 512) for i in u) for u in sched_ids],
                "update_sha256": [update_sha256(u) for u in sched_ids]}
    cfg = model_config(plan.model.config) if profile == "full" else model_config(plan.model.config, len(tokenizer))
    model = build_model(cfg, plan.study.seed, device)
    steps = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    prof = None

    def on_step(u, m, _sha):
        nonlocal prof
        steps.append(m)
        if trace_update and u == trace_update - 1:  # profile exactly update `trace_update`
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        elif prof is not None and u == trace_update:
            prof.__exit__(None, None, None)
            sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
            trace_out.write_text(prof.key_averages().table(sort_by=sort, row_limit=30))
            prof = None

    res = train(plan, arm, model, tokenizer, docs, schedule, device, 0, 1, on_step=on_step,
                log=lambda *a: None)
    wall = time.perf_counter() - t0
    post = [m["perf/step_s"] for m in steps[3:]]  # after warm-up (and compression start at 3)
    params = sum(p.numel() for p in model.parameters())
    tokens = statistics.mean(m["perf/tokens_per_s"] * m["perf/step_s"] for m in steps)
    med = statistics.median(post)
    out = {"arm": arm, "error_feedback": error_feedback if arm == "powersgd" else None,
           "updates": updates, "params": params, "tokens_per_update": tokens,
           "median_step_s": med, "tokens_per_s": tokens / med,
           # 6 N flops per token (forward + backward), attention excluded: a floor on MFU
           "model_tflops_per_s": 6 * params * tokens / med / 1e12,
           "step_s": [m["perf/step_s"] for m in steps], "loss": res.losses, "wall_s": wall,
           "logical_bytes_per_exchange": steps[-1]["comm/logical_bytes"],
           "peak_gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def run(args) -> list[dict]:
    import torch
    import torch.distributed as dist

    from gradshare.data.tokenizer import load_tokenizer, train_bpe

    cuda = torch.cuda.is_available() and args.profile == "full"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    docs = documents(args.updates * 32, 7)
    tok_dir = Path(args.workdir) / "tokenizer"
    train_bpe([d["target"] for d in docs], 4096, tok_dir)
    tokenizer = load_tokenizer(tok_dir)
    results = []
    arms = (("single", "fp32-host"), ("dense", "fp32-host"), ("powersgd", "fp32-host"), ("powersgd", "device"))
    if args.trace:  # one arm, one profiled update after compression has started
        arms = (("dense", "fp32-host"), ("powersgd", "device"))
    for arm, ef in arms:
        trace = Path(args.out).with_name(f"trace_{arm}_{ef}.txt") if args.trace else None
        r = bench_arm(arm, ef, args.profile, args.updates, tokenizer, docs, device,
                      trace_update=args.updates if args.trace else 0, trace_out=trace)
        results.append(r)
        print(f"{arm:<9}{str(r['error_feedback'] or ''):<10} median step {r['median_step_s']:.3f}s  "
              f"{r['tokens_per_s']:,.0f} tok/s  {r['model_tflops_per_s']:.0f} TFLOP/s  "
              f"peak {r['peak_gpu_mem_gib'] or 0:.1f} GiB  final loss {r['loss'][-1]:.3f}", flush=True)
    dist.destroy_process_group()
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"env": env, "results": results}, indent=1))
    return results


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["arm"] == "single"), results[0])["median_step_s"]
    lines = [f"{'arm':<9}{'error':<10}{'step s':>8}{'vs single':>10}{'tok/s':>10}{'TFLOP/s':>9}"
             f"{'peak GiB':>9}{'logical MB':>11}"]
    for r in results:
        lines.append(f"{r['arm']:<9}{str(r['error_feedback'] or '-'):<10}{r['median_step_s']:>8.3f}"
                     f"{r['median_step_s'] / base:>9.2f}x{r['tokens_per_s']:>10,.0f}"
                     f"{r['model_tflops_per_s']:>9.0f}{(r['peak_gpu_mem_gib'] or 0):>9.1f}"
                     f"{r['logical_bytes_per_exchange'] / 1e6:>11.1f}")
    return "\n".join(lines)


def log_to_mlflow(path: Path, experiment: str) -> None:
    import mlflow

    data = json.loads(path.read_text())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"arms-one-gpu-{data['env']['device']}"):
        mlflow.set_tags({"gradshare.step": "benchmark", **{f"env.{k}": str(v) for k, v in data["env"].items()}})
        for r in data["results"]:
            key = r["arm"] + (f"-{r['error_feedback']}" if r["error_feedback"] else "")
            mlflow.log_metrics({f"{key}/median_step_s": r["median_step_s"], f"{key}/tokens_per_s": r["tokens_per_s"],
                                f"{key}/model_tflops_per_s": r["model_tflops_per_s"]})
        mlflow.log_text(table(data["results"]), "table.txt")
        mlflow.log_dict(data, "results.json")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="full")
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--out", default="arms_one_gpu.json")
    ap.add_argument("--workdir", default="/tmp/gradshare-bench")
    ap.add_argument("--trace", action="store_true", help="profile the last update of dense and powersgd")
    ap.add_argument("--log", help="log this result file to MLflow instead of running")
    ap.add_argument("--experiment", default="gradshare-benchmarks")
    args = ap.parse_args(argv)
    if args.updates < 4:  # the median is taken after 2 warm-up and the first compressed update
        ap.error("--updates must be at least 4")
    if args.log:
        log_to_mlflow(Path(args.log), args.experiment)
        print(table(json.loads(Path(args.log).read_text())["results"]))
        return
    print(table(run(args)))


if __name__ == "__main__":
    main()
