"""Fit the projection's per-update cost parts (`gradshare.cost.gpu_cost`) to one GPU benchmark call.

    python benchmarks/calibrate_projection.py benchmarks/results/2026-12-04-h200-a8e8d35-gpu_path.json \\
        --memory-gbps 4300 --memory-source "..." --out gradshare/cost/calibration/gpu_cost_h200.json

From the call's result file and its profile of the single arm's last update (on the study's
documents): b, one micro-batch's gradient additions, and c, the clip, AdamW and zeroing, are
the profiled update's own kernels; each update's padded tokens and micro-batches come from
rebuilding the call's workloads and laying them out as the loop does (`gradshare.inputs.workload`).
PowerSGD's compression is the profiled update's own range ('powersgd: compression'), at rank 32
and, where the call ran `powersgd-rank-8`, at rank 8 too (its slope); where the call has no such
profile it is what is left of PowerSGD's update with every copy counted whole. The hook the call
measured says how its copies moved (`copy_overlap`: `fold` hides them behind the micro-batches).
Then a (seconds per padded token) and dense's extra are fitted on one workload's medians
(updates 4..N-1) and every arm is predicted on the other by the product's own `Calibration.seconds`;
both directions are printed, and the fit on the study's documents is written with its checks and
provenance.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataclasses import replace  # noqa: E402

from benchmarks import workloads  # noqa: E402

ARMS = {"study": ("single", "dense", "powersgd"), "stand-in-512": ("single-512", "dense-512", "powersgd-512")}
FIXED_KERNELS = ("aten::_fused_adamw_", "aten::_foreach_norm", "aten::_foreach_mul_",
                 "Optimizer.zero_grad#AdamW.zero_grad")
ADDITIONS = "vectorized_elementwise_kernel"  # the micro-batches' gradient additions (AccumulateGrad)
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def profile_rows(text: str) -> list[tuple[str, float, int]]:
    """(name, self device seconds, calls) of each row of a `key_averages().table()`."""
    rows = []
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 11 or not re.match(r"[\d.]+(us|ms|s)$", cells[6]):
            continue
        value, unit = re.match(r"([\d.]+)(us|ms|s)$", cells[6]).groups()
        rows.append((cells[0], float(value) * _UNIT[unit], int(cells[-1])))
    return rows


def memory_bound_parts(profile: str, micro_batches: int) -> tuple[float, float]:
    """(b, c) from the profiled update: its gradient additions per micro-batch, and its fixed kernels."""
    rows = profile_rows(profile)
    additions = sum(t for name, t, _ in rows if ADDITIONS in name)
    fixed = sum(max((t for name, t, _ in rows if name == k), default=0.0) for k in FIXED_KERNELS)
    return additions / micro_batches, fixed


def workload_figures(workload: str, workdir: Path, updates: int) -> list[dict]:
    """Per update of the benchmark's schedule: padded tokens and micro-batches of one rank at world 1."""
    from gradshare.inputs.workload import describe

    workloads.build(workload, workdir, log=lambda *a: None)
    docs, tokenizer, schedule = workloads.load(workload, workdir, updates)
    record = describe(workloads.bench_plan("full", {}), docs, tokenizer, schedule)
    return [u["w1"] for u in record["updates"]]


def medians(result: dict, figures: list[dict], updates: int) -> dict:
    steady = [r for r in result["rows"] if 4 <= r["update"] <= updates - 1]
    return {"s": statistics.median(r["step_s"] for r in steady),
            "padded": statistics.median(figures[r["update"] - 1]["padded_tokens"] for r in steady),
            "mbs": statistics.median(figures[r["update"] - 1]["micro_batches"] for r in steady)}


def fit(m: dict, b: float, c: float, copies: float, measured_compress: float | None = None) -> dict:
    """a and dense's extra from single and dense; the compression measured in the profile where there
    is one, else what is left of PowerSGD's update with every copy counted whole (a hook that
    hides none)."""
    single, dense, psgd = m
    a = (single["s"] - b * single["mbs"] - c) / single["padded"]
    dense_extra = dense["s"] - (a * dense["padded"] + b * dense["mbs"] + c)
    compress = measured_compress if measured_compress is not None else \
        psgd["s"] - (a * psgd["padded"] + b * psgd["mbs"] + c) - dense_extra - copies
    return {"s_per_padded_token": a, "dense_extra_s": dense_extra, "compress_s": compress}


def predict(cal, plan, m: dict, arm: str) -> float:
    """The product's own figure (`Calibration.seconds`) for one arm's median update at world 1."""
    return cal.seconds(plan.arm(arm), plan, m["padded"], m["mbs"])


def compression(res: dict, name: str) -> float | None:
    """The profiled update's compression, seconds of GPU time (gpu_path's profile of `name`)."""
    return ((res.get(name) or {}).get("profile") or {}).get("compression_device_s") or None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result")
    ap.add_argument("--profile", help="the single arm's profile (default: beside the result file)")
    ap.add_argument("--memory-gbps", type=float, help="the GPU's memory bandwidth, GB/s (default: the "
                                                      "call's own device copy, where it measured one)")
    ap.add_argument("--memory-source", default="", help="where --memory-gbps comes from")
    ap.add_argument("--workdir", default="/tmp/gradshare-calibrate")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from gradshare.cost.gpu_cost import Calibration, GpuRates
    from gradshare.model.source import parameter_shapes
    from gradshare.contract.plan import load_plan

    path = Path(args.result)
    data = json.loads(path.read_text())
    updates = data["env"]["updates"]
    res = {r["config"]: r for r in data["results"]}
    cal = data["calibrate"]
    memory, memory_source = args.memory_gbps, args.memory_source
    if memory is None:
        if not cal.get("device_copy_gbps"):
            ap.error("this call measured no device copy: give --memory-gbps and --memory-source")
        memory, memory_source = cal["device_copy_gbps"], "a device-to-device copy in the same call"
    profile = Path(args.profile or str(path).replace("gpu_path.json", "profile_single.txt"))
    figures = {w: workload_figures(w, Path(args.workdir), updates) for w in ARMS}
    m = {w: [medians(res[name], figures[w], updates) for name in names] for w, names in ARMS.items()}
    b, c = memory_bound_parts(profile.read_text(), figures["study"][updates - 1]["micro_batches"])
    plan = workloads.bench_plan("full", {})
    params = sum(__import__("math").prod(s) for s in parameter_shapes(load_plan("full")))
    error_bytes = 4 * params
    copies = 2 * error_bytes / (cal["copy_gbps"]["both"] * 1e9)
    # the hook the call measured: it says how its copies moved (gradshare.kinds.powersgd_hook.COPY_OVERLAP)
    overlap = res["powersgd"].get("copy_overlap", "none")
    c32, c8 = compression(res, "powersgd"), compression(res, "powersgd-rank-8")
    slope = (c32 - c8) / (32 - 8) if (c32 and c8) else 0.0
    e = data["env"]
    gpu = GpuRates(name=e["device"], matmul_tflops=cal["matmul_tflops"], memory_gbps=memory,
                   pinned_both_gbps=cal["copy_gbps"]["both"],
                   source=f"measured on one {e['device']} on {e['date']} at commit {e['commit']} "
                          f"(benchmarks/gpu_path.py: matrix rate and pinned copies in the same call); "
                          f"memory bandwidth: {memory_source}")
    compress_source = ("its profiled compression" + (" at ranks 32 and 8" if slope else " at rank 32") if c32
                       else "what is left of PowerSGD's update")
    checks, made = {}, {}
    for on, other in (("study", "stand-in-512"), ("stand-in-512", "study")):
        made[on] = Calibration(gpu=gpu, s_fixed=c, s_per_micro_batch=b, error_bytes=error_bytes, checks={},
                               source="", copy_overlap=overlap, compress_s_per_rank=slope,
                               **fit(m[on], b, c, copies, c32))
        for arm, got in zip(("single", "dense", "powersgd"), m[other]):
            want = predict(made[on], plan, got, arm)
            checks[f"fitted on {on}, {arm} on {other}"] = {"predicted_s": want, "measured_s": got["s"],
                                                           "error": want / got["s"] - 1}
    for k, v in checks.items():
        print(f"{k:<45} predicted {v['predicted_s']:.3f} s, measured {v['measured_s']:.3f} s ({v['error']:+.1%})")
    out = replace(made["study"], checks=checks,
                  source=f"{path.name}: b and c from its profiled update of single (study's documents), "
                         f"a and dense's extra fitted on the study's documents (medians of updates "
                         f"4..{updates - 1}), compression from {compress_source}, the error's copies "
                         f"{'folded in during the micro-batches' if overlap == 'fold' else 'all exposed'}; "
                         f"checked on the 512-token stand-ins")
    print(json.dumps(out.to_dict(), indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out.to_dict(), indent=1) + "\n")


if __name__ == "__main__":
    main()
