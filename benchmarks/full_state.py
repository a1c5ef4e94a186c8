"""Benchmark: size and save/load seconds of a full-state checkpoint (`gradshare.train.fullstate`)
for each arm, and whether a resumed run continues exactly.

    python benchmarks/full_state.py --out $OUT/full_state.json       # H200, 1.7B shape: ~5 minutes
    python benchmarks/full_state.py --profile tiny --out r.json      # CPU, the tiny model: seconds

For each arm (world size 1, as `benchmarks/gpu_path.py`: DDP over a one-rank group for
dense and powersgd) the production loop (`gradshare.train.loop.train`, random weights)
runs 5 updates with a full state saved after update 3 (PowerSGD's warm-up is 2 exchanges,
so its FP32 error feedback is in it), then the state is loaded and a second loop resumes
from it for updates 4-5; the final weights of both are compared (bit-equal or the largest
difference). Disk: the state directory is written under --dir (default a temporary one) and
removed after each arm.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UPDATES = 5
SAVE_AFTER = 3


def one_arm(arm: str, profile: str, tokenizer, docs, device, root: Path, control_run: bool = False) -> dict:
    import torch

    from benchmarks import workloads as W
    from gradshare.model.lm import build_model
    from gradshare.model.source import model_config
    from gradshare.util.sources import set_determinism
    from gradshare.train import fullstate
    from gradshare.train.loop import FullStatePolicy, TrainJob, train

    extra = {"hardware.compile": "false",  # what is measured is the state, not the update speed
             "hardware.deterministic": "true"}  # so that "resumed = straight" can be asked bit for bit
    plan = W.bench_plan(profile, extra, UPDATES)
    set_determinism(plan.hardware.deterministic, compiles=plan.hardware.compile)
    docs = {d["id"]: d for d in docs[:UPDATES * W.DOCS_PER_UPDATE]}
    schedule = W.schedule_for(tokenizer, docs, UPDATES, plan.study.seed)
    cfg = model_config(plan.model.config) if profile == "full" else model_config(plan.model.config, len(tokenizer))
    quiet = lambda *a: None  # noqa: E731
    saved = {}

    def on_saved(path, manifest):
        saved.update(path=path, manifest=manifest)

    model = build_model(cfg, plan.study.seed, device)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings once
    train(TrainJob(plan, arm, model, tokenizer, docs, schedule, device, 0, 1, log=quiet,
          full_state=FullStatePolicy(every=SAVE_AFTER, root=root, on_saved=on_saved)))
    straight = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    del model
    _release(device.type == "cuda")
    t0 = time.perf_counter()
    state = fullstate.load(saved["path"], 1)
    load_s = time.perf_counter() - t0
    model = build_model(cfg, plan.study.seed, device)
    train(TrainJob(plan, arm, model, tokenizer, docs, schedule, device, 0, 1, log=quiet, full_state=FullStatePolicy(resume=state)))
    resumed = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    worst = max((straight[k] - resumed[k]).abs().max().item() for k in straight)
    control = None
    if control_run:  # a second uninterrupted run: how far two straight runs already differ here
        del model
        _release(device.type == "cuda")
        model = build_model(cfg, plan.study.seed, device)
        train(TrainJob(plan, arm, model, tokenizer, docs, schedule, device, 0, 1, log=quiet))
        control = max((straight[k] - v.detach().float().cpu()).abs().max().item() for k, v in model.state_dict().items())
    files = saved["manifest"]["files"]
    out = {"arm": arm, "bytes": saved["manifest"]["bytes"], "save_s": saved["manifest"]["save_s"], "load_s": load_s,
           "files_bytes": {k: v["bytes"] for k, v in files.items()},
           "resumed_equal": all(torch.equal(straight[k], resumed[k]) for k in straight), "max_abs_diff": worst,
           "straight_twice_max_abs_diff": control,
           "params": params}
    del model, state
    _release(device.type == "cuda")
    shutil.rmtree(root, ignore_errors=True)
    return out


def _release(cuda: bool) -> None:
    # DDP and its hooks form reference cycles: without a collection an arm's model, buckets
    # and optimizer state stay allocated into the next one.
    import gc

    import torch

    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="full")
    ap.add_argument("--arms", default="single,dense,powersgd")
    ap.add_argument("--dir", default="")
    ap.add_argument("--control", action="store_true", help="also a second straight run, compared with the first")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import os

    import torch
    import torch.distributed as dist

    from benchmarks import workloads as W
    from gradshare.data.tokenizer import load_tokenizer, train_bpe

    cuda = torch.cuda.is_available() and args.profile == "full"
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    docs = W.stand_in_documents(UPDATES * W.DOCS_PER_UPDATE, 7)
    base = Path(args.dir or tempfile.mkdtemp(prefix="gradshare-fullstate-"))
    train_bpe([d["target"] for d in docs], 4096, base / "tokenizer")
    tokenizer = load_tokenizer(base / "tokenizer")
    rows = []
    for arm in args.arms.split(","):
        t0 = time.perf_counter()
        rows.append(one_arm(arm, args.profile, tokenizer, docs, device, base / arm, args.control) | {"wall_s": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "date": time.strftime("%Y-%m-%d"), "profile": args.profile}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print("| arm | full state GB | model | optimizer | ranks (RNG, PowerSGD) | save s | load s | resumed = straight |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = r["files_bytes"]
        print(f"| {r['arm']} | {r['bytes'] / 1e9:.2f} | {f['model.pt'] / 1e9:.2f} | {f['optimizer.pt'] / 1e9:.2f} | "
              f"{f['rank0.pt'] / 1e9:.2f} | {r['save_s']:.1f} | {r['load_s']:.1f} | "
              f"{'bit-equal' if r['resumed_equal'] else 'max |diff| %.2e' % r['max_abs_diff']} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
