"""Benchmark: the GPU path on the study's own documents and on the 512-token stand-ins, one H200.

    python benchmarks/gpu_path.py --out $OUT/gpu_path.json            # the GPU machine: ~9 minutes
    python benchmarks/gpu_path.py --only single,dense --out r.json      # some configurations
    python benchmarks/gpu_path.py --log r.json --benchmarks-md BENCHMARKS.md
        # here: log a result file to MLflow ($MLFLOW_TRACKING_URI or sqlite:///mlflow.db) and
        # append its tables to BENCHMARKS.md

Builds both workloads once (`benchmarks/workloads.py`: the study's via prepare's own code, no
MLflow needed), measures the card (`calibrate`), then runs every configuration of
`benchmarks/gpu_configs.py` in a process of its own, so that no arm's memory, compile cache
in memory or CUDA state leaks into the next (the on-disk compile cache is shared, as on a
host that runs the three arms one after another). Essential configurations run first; past
`--budget-s` the rest are recorded as skipped. The result file is written after every
configuration. Figures: the median of updates 4 .. N-1 (update N is profiled where asked).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_configs, workloads  # noqa: E402
from gradshare.contract.tags import STEP  # noqa: E402

# Essential first: every arm, the cap's reason, each lever off (graphs, packing), the reference;
# then the stand-ins; then the variants measured and not taken (BENCHMARKS.md, 2026-12-04).
ORDER = ("single", "dense", "powersgd", "single-cap-30", "single-no-graphs", "single-by-count", "ref-single",
         "single-512", "dense-512", "powersgd-512", "single-512-by-count", "powersgd-cholqr2", "powersgd-512-cholqr2",
         "powersgd-rank-8", "powersgd-fold", "powersgd-512-fold", "powersgd-fold-rank-8",
         "powersgd-cholqr2-staging-2048", "powersgd-512-cholqr2-staging-2048", "single-4096", "single-512-4096",
         "powersgd-staging-2048", "ref-single-512", "powersgd-by-count", "ref-dense")
DENSE_OF = {"powersgd": "dense", "powersgd-512": "dense-512", "powersgd-staging-2048": "dense",
            "powersgd-by-count": "dense", "powersgd-4096": "dense", "powersgd-cholqr2": "dense",
            "powersgd-cholqr2-staging-2048": "dense", "powersgd-512-cholqr2-staging-2048": "dense-512",
            "powersgd-512-cholqr2": "dense-512", "powersgd-rank-8": "dense",
            "powersgd-fold": "dense", "powersgd-512-fold": "dense-512", "powersgd-fold-rank-8": "dense"}


def summarise(r: dict, updates: int) -> dict:
    """The figures of one configuration's rows (median over updates 4 .. N-1)."""
    rows = r.get("rows") or []
    if "error" in r or not rows:
        return {}
    steady = [x for x in rows if 4 <= x["update"] <= updates - 1] or rows
    step = statistics.median(x["step_s"] for x in steady)
    tokens = statistics.mean(x["tokens"] for x in steady)
    out = {"step_s": step, "tokens_per_s": tokens / step,
           "peak_gib": max(x["allocated_gib"] for x in rows), "peak_reserved_gib": max(x["reserved_gib"] for x in rows),
           "updates_done": len(rows)}
    if "compiles" in rows[0]:
        by_update = {x["update"]: x["compiles"] for x in rows}
        out["compiles_after_3"] = by_update[max(by_update)] - by_update.get(3, by_update[min(by_update)])
    if r.get("startup_s") is not None:
        out["startup_s"] = r["startup_s"]
    return out


def run_all(args) -> dict:
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir)
    log = open(out_path.parent / "gpu_path_log.txt", "a")
    t_start = time.perf_counter()
    for w in workloads.WORKLOADS:
        t0 = time.perf_counter()
        workloads.build(w, workdir, log=lambda *a: None)
        print(f"workload {w}: built in {time.perf_counter() - t0:.1f}s", flush=True)
    commit = os.environ.get("GRADSHARE_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    import torch
    import transformers

    device = "CPU smoke run (tiny model)" if args.smoke else torch.cuda.get_device_name(0)
    data = {"env": {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
                    "device": device, "commit": commit, "updates": args.updates,
                    "date": time.strftime("%Y-%m-%d", time.gmtime())},
            "results": []}
    names = [n for n in ORDER if not args.only or n in args.only.split(",")]
    for name in ([] if args.skip_calibrate else ["calibrate"]) + names:
        left = args.budget_s - (time.perf_counter() - t_start)
        if left < 45:
            data["results"].append({"config": name, "skipped": f"the call's {args.budget_s:.0f} s were used"})
            continue
        t0 = time.perf_counter()
        one = out_path.parent / f".{name}.json"
        cmd = [sys.executable, str(Path(gpu_configs.__file__)), "--one", name, "--workdir", str(workdir),
               "--updates", str(args.updates), "--out", str(one), "--profile-dir", str(out_path.parent),
               *(["--smoke"] if args.smoke else [])]
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=min(left - 5, args.config_s))
            r = json.loads(one.read_text()) if one.exists() else {"config": name, "error": f"exit {proc.returncode}"}
        except subprocess.TimeoutExpired:
            r = {"config": name, "error": f"timed out after {min(left - 5, args.config_s):.0f} s"}
        one.unlink(missing_ok=True)
        r["process_s"] = time.perf_counter() - t0
        if name == "calibrate":
            data["calibrate"] = r
            print(f"calibrate: {json.dumps(r)[:400]}", flush=True)
        else:
            r["summary"] = summarise(r, args.updates)
            data["results"].append(r)
            print(line(r), flush=True)
        out_path.write_text(json.dumps(data, indent=1))
    return data


def line(r: dict) -> str:
    s = r.get("summary") or {}
    if "error" in r:
        return f"{r['config']:<24} error: {r['error'][:300]}"
    head = f"{r['config']:<24} "
    if s:
        head += (f"{s['step_s']:.3f} s/update  {s['tokens_per_s']:,.0f} tok/s  peak {s['peak_gib']:.1f} GiB "
                 f"(reserved {s['peak_reserved_gib']:.1f})  compiles after u3 {s.get('compiles_after_3', '-')}  "
                 f"start-up {s.get('startup_s') or 0:.1f}s  steps " + " ".join(f"{x['step_s']:.2f}" for x in r["rows"]))
    if r.get("failure_reason"):
        head += f"  FAILED: {r['failure_reason']}"
    return head + f"  ({r.get('process_s', 0):.0f}s)"


def flops_per_token(params: int) -> float:
    """6 N: every weight in a matrix product forward and twice backward (the tied embedding once,
    as the head's product). Attention's own FLOPs are left out: under 5% at these lengths."""
    return 6 * params


def table_rows(data: dict) -> list[dict]:
    res = {r["config"]: r for r in data["results"]}
    rate = (data.get("calibrate") or {}).get("matmul_tflops")
    rows = []
    for r in data["results"]:
        s = r.get("summary") or {}
        row = {"config": r["config"], "workload": gpu_configs.CONFIGS.get(r["config"], ("?",))[0], **s,
               "failure_reason": r.get("failure_reason") or r.get("error") or r.get("skipped"),
               "graphs": r.get("graphs"), "peaks": [round(x["reserved_gib"], 1) for x in r.get("rows") or []],
               "profile": r.get("profile") or {},
               "alloc_retries": max((x.get("alloc_retries", 0) for x in r.get("rows") or []), default=0)}
        if s and rate:
            row["mfu"] = flops_per_token(r["params"]) * s["tokens_per_s"] / 1e12 / rate
        dense = res.get(DENSE_OF.get(r["config"], ""), {}).get("summary")
        if s and dense:
            row["extra_over_dense_s"] = s["step_s"] - dense["step_s"]
            row["prefetched_gb"] = (r.get("error_prefetched_bytes") or 0) / max(1, s["updates_done"] - 2) / 1e9
        rows.append(row)
    return rows


SAME_UPDATES = (("single", "single-no-graphs"), ("single", "single-by-count"), ("single-512", "single-512-by-count"),
                ("dense", "single"), ("powersgd-cholqr2", "powersgd"))


def loss_agreement(data: dict) -> list[str]:
    """The same updates by two paths from the same initial weights: the largest relative
    difference of their losses (bf16 autocast: ~1e-3 is rounding)."""
    res = {r["config"]: r for r in data["results"] if r.get("rows")}
    out = []
    for a, b in SAME_UPDATES:
        if a in res and b in res:
            la, lb = [x["loss"] for x in res[a]["rows"]], [x["loss"] for x in res[b]["rows"]]
            worst = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
            out.append(f"{a} vs {b} {worst:.1e}")
    return out


def markdown(data: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    e, cal = data["env"], data.get("calibrate") or {}
    copies = cal.get("copy_gbps") or {}
    num = cal.get("numerics") or {}
    params = next((r["params"] for r in data["results"] if r.get("params")), None)
    floor = 2 * 4 * params / (copies["both"] * 1e9) if params and copies.get("both") else None
    head = (f"### {e['date']} · {e['device']} · torch {e['torch']} (CUDA {e['cuda']}) · transformers "
            f"{e.get('transformers')} · commit {e['commit']}\n\n"
            f"{e['updates']} updates per configuration, each in a process of its own, under the allocator cap "
            f"the worker applies (`hardware.max_device_gib`, 44 GiB unless named); median of updates 4..{e['updates'] - 1}. "
            f"bf16 matrix rate measured in the same call: {f(cal.get('matmul_tflops'), '.0f')} TFLOP/s (the MFU "
            f"denominator, 6 N per token). Pinned host copies, GB/s: H2D {f(copies.get('h2d'), '.1f')}, D2H "
            f"{f(copies.get('d2h'), '.1f')}, both at once {f(copies.get('both'), '.1f')}: the FP32 error's round trip "
            f"(2 x {f(params and 4 * params / 1e9, '.2f')} GB per update) has a floor of {f(floor, '.3f')} s. "
            f"Fast hook vs upstream `powerSGD_hook` on the same gradients (relative L2, worst exchange): "
            + ", ".join(f"{k} {f(max(v), '.1e')}" for k, v in num.items()) + ". The same updates' losses by "
            f"two paths (largest relative difference over the {e['updates']} updates): "
            + (", ".join(loss_agreement(data)) or "-") + ".\n\n")
    out = [head]
    for workload in workloads.WORKLOADS:
        rows = [r for r in table_rows(data) if r["workload"] == workload]
        if not rows:
            continue
        out.append(f"**{workload}** ({'the full profile prepared: median ~3,400 tokens per update' if workload == 'study' else '32 x 512 tokens per update'})\n\n")
        out.append("| configuration | s/update | tokens/s | MFU | peak GiB (allocated / reserved) | compiles after update 3 "
                   "| start-up s | over its dense, s | notes |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in rows:
            notes = []
            if r.get("failure_reason"):
                notes.append(str(r["failure_reason"])[:400])
            g = r.get("graphs")
            if g:
                notes.append(f"{g['captured']}/{g['shapes']} shapes captured" + (f" ({g['failed']})" if g.get("failed") else ""))
            if r.get("prefetched_gb"):
                notes.append(f"{r['prefetched_gb']:.2f} GB of error fetched during the micro-batches per update")
            prof = r["profile"]
            if prof.get("compression_device_s"):
                notes.append(f"compression {prof['compression_device_s'] * 1e3:.0f} ms of GPU time in the profiled update, "
                             f"{prof.get('orthogonalisation_calls', '-')} orthogonalisation calls")
            if r["alloc_retries"]:
                notes.append(f"the allocator freed its cache and retried {r['alloc_retries']} times")
            if "step_s" not in r:
                out.append(f"| {r['config']} | - | - | - | - | - | - | - | {'; '.join(notes)} |\n")
                continue
            out.append(f"| {r['config']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {f(r.get('mfu'), '.0%')} "
                       f"| {r['peak_gib']:.1f} / {r['peak_reserved_gib']:.1f} | {f(r.get('compiles_after_3'), 'd')} "
                       f"| {f(r.get('startup_s'), '.1f')} | {f(r.get('extra_over_dense_s'), '+.3f')} | {'; '.join(notes)} |\n")
        out.append("\nPer-update peaks, GiB reserved (the cap counts reserved memory): "
                   + "; ".join(f"{r['config']} {' '.join(map(str, r['peaks']))}" for r in rows if r["peaks"]) + ".\n\n")
    return "".join(out)


def log_to_mlflow(path: Path, experiment: str) -> str:
    import mlflow

    from gradshare.contract import metrics as M
    data = json.loads(path.read_text())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"gpu-path-{data['env']['device']}") as run:
        mlflow.set_tags({STEP: "benchmark", **{f"env.{k}": str(v) for k, v in data["env"].items()}})
        if (data.get("calibrate") or {}).get("matmul_tflops"):
            mlflow.log_metric(M.BENCH_MATMUL_TFLOPS, data["calibrate"]["matmul_tflops"])
        for r in table_rows(data):
            mlflow.log_metrics({M.bench(r["config"], k): r[k] for k in M.BENCH_FIGURES if r.get(k) is not None})
        mlflow.log_text(markdown(data), "table.md")
        mlflow.log_dict(data, "results.json")
        return run.info.run_id


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--out", default="gpu_path.json")
    ap.add_argument("--workdir", default="/tmp/gradshare-gpu-path")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting configurations past this")
    ap.add_argument("--config-s", type=float, default=240.0, help="the longest one configuration may take")
    ap.add_argument("--smoke", action="store_true", help="a CPU and the tiny model: checks the harness in seconds")
    ap.add_argument("--skip-calibrate", action="store_true",
                    help="no card measurements (matrix rate, copies, hook numerics): configurations only")
    ap.add_argument("--log", help="log this result file to MLflow instead of running")
    ap.add_argument("--benchmarks-md", help="with --log: append the tables to this file")
    ap.add_argument("--experiment", default="gradshare-benchmarks")
    args = ap.parse_args(argv)
    if args.updates < 6:  # updates 4 .. N-1 are the steady ones
        ap.error("--updates must be at least 6")
    if args.log:
        data = json.loads(Path(args.log).read_text())
        run_id = log_to_mlflow(Path(args.log), args.experiment)
        md = markdown(data)
        if args.benchmarks_md:
            with open(args.benchmarks_md, "a") as fh:
                fh.write("\n" + md + f"MLflow: experiment `{args.experiment}`, run `{run_id}`.\n")
        print(md)
        return
    print(markdown(run_all(args)))


if __name__ == "__main__":
    main()
