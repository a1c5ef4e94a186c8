"""Benchmark: the whole study rehearsed on one GPU, through gradshare's own steps, timed.

    python benchmarks/rehearsal.py --work /tmp/rehearsal            # on a machine with one CUDA GPU
    python benchmarks/rehearsal.py --table /tmp/rehearsal/out/rehearsal.json --benchmarks-md BENCHMARKS.md
        # here: print the table of a result (and append it to BENCHMARKS.md)

prepare (full profile, a random 1.7B model, `-P hardware.rehearsal=one-gpu`) -> train single
-> train dense -> train powersgd (both ranks on the one GPU, over gloo) -> commit -> score ->
analyze, each step its real entry point in a process of its own, in a SQLite store under
`--work` (artifacts beside it). The study is cut to 16 updates x 32 documents
(`schedule.updates=16 data.train_per_family=96 data.replay_docs=128`) so that it fits one
machine's lease; everything else is the full profile's. Its speed and cost are not the study's
(two ranks share one GPU and exchange through host memory): what it measures is the path
itself, start-up, compile, checkpoint, upload and scoring times, and each rank's peak memory
under the 44 GiB cap.

Writes under `--work`/out: `rehearsal.json` (each step's seconds, each arm's phases, peaks and
outcome, each scored model's seconds), `rehearsal.md` (the table) and `store.tar.gz` (the
SQLite store and every artifact but the checkpoints, to analyze elsewhere). `done` appears
there when it ends.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from gradshare.contract.tags import ARM, FAILURE, REFUSAL
from gradshare.tracking import connection
from gradshare.tracking import study_runs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STUDY = "rehearsal-one-gpu"
OVERRIDES = {"hardware.rehearsal": "one-gpu", "schedule.updates": "16", "data.train_per_family": "96",
             "data.replay_docs": "128"}
ARMS = ("single", "dense", "powersgd")


def _overrides(smoke: bool, extra: list[str]) -> dict:
    """The rehearsal's plan overrides, and any `concern.field=value` given with --set (say why in
    the result: e.g. `hardware.cuda_graphs=false` to fit two ranks on an 80 GB card)."""
    return {} if smoke else OVERRIDES | dict(x.split("=", 1) for x in extra)


def _steps(overrides: dict, smoke: bool) -> list[tuple[str, list[str]]]:
    prep = ["prepare", "--study", STUDY, "--profile", "smoke" if smoke else "full", "--new-study", "true"]
    for k, v in overrides.items():
        prep += [f"--{k}", v]
    return ([("prepare", prep)] + [(f"train {arm}", ["train", "--study", STUDY, "--arm", arm]) for arm in ARMS]
            + [(step, [step, "--study", STUDY]) for step in ("commit", "score", "analyze")])


def run(work: Path, smoke: bool = False, extra: list[str] = ()) -> dict:
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "GRADSHARE_OUTBOX": str(work / "outbox"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    overrides = _overrides(smoke, list(extra))
    data = {"study": STUDY, "overrides": overrides, "smoke": smoke, "steps": {}, "env": _env()}
    t_all = time.perf_counter()
    for name, args in _steps(overrides, smoke):
        t0 = time.perf_counter()
        print(f"[rehearsal] {name} ...", flush=True)
        done = subprocess.run([sys.executable, "-m", f"entrypoints.{args[0]}", *args[1:]], cwd=work, env=env)
        data["steps"][name] = {"s": time.perf_counter() - t0, "rc": done.returncode}
        print(f"[rehearsal] {name}: rc {done.returncode}, {data['steps'][name]['s']:.0f} s", flush=True)
        (out / "rehearsal.json").write_text(json.dumps(data, indent=1))  # partial results survive a cut
        if name == "prepare" and done.returncode != 0:
            break
    data["whole_s"] = time.perf_counter() - t_all
    os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_URI",)})
    data |= _from_store()
    (out / "rehearsal.json").write_text(json.dumps(data, indent=1))
    (out / "rehearsal.md").write_text(markdown(data))
    _pack(work, out / "store.tar.gz")
    (out / "done").write_text("")
    return data


def _env() -> dict:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "commit": commit}


def _from_store() -> dict:
    """Each arm's outcome, phases and peaks; each scored model's seconds; the report's path."""
    from gradshare.contract import metrics as M
    arms = {}
    for arm in ARMS:
        runs = [r for r in study_runs.search(STUDY, "train", arm) if r.data.tags.get(REFUSAL) != "true"]
        if not runs:
            arms[arm] = {"status": "not run"}
            continue
        r = runs[-1]
        m = r.data.metrics
        steps = [x.value for x in connection.client().get_metric_history(r.info.run_id, M.STEP_S)]
        arms[arm] = {"status": r.info.status, "reason": r.data.tags.get(FAILURE),
                     "phases_s": {p: m.get(M.phase_s(p)) for p in M.PHASES},
                     "wall_s": m.get(M.WALL_S), "median_step_s": sorted(steps)[len(steps) // 2] if steps else None,
                     "updates": len(steps), "ckpt_bytes": m.get(M.CKPT_BYTES),
                     "peaks_gib": {rank: (m.get(M.peak_allocated_gib(rank)), m.get(M.peak_reserved_gib(rank)))
                                   for rank in range(2) if M.peak_reserved_gib(rank) in m},
                     "replica_tensors": m.get(M.REPLICA_TENSORS)}
    scored = {}
    for r in study_runs.search(STUDY, "score"):
        if ARM in r.data.tags:
            m = r.data.metrics
            scored[r.data.tags[ARM]] = {k: m.get(v) for k, v in (("load_s", M.SCORE_LOAD_S),
                                                                   ("test_s", M.SCORE_TEST_S),
                                                                   ("retention_s", M.SCORE_RETENTION_S))}
    return {"arms": arms, "scored": scored}


def _pack(work: Path, dst: Path) -> None:
    """The store without the checkpoints (6.8 GB each): what the report and the runs need."""
    def keep(info: tarfile.TarInfo):
        parts = Path(info.name).parts
        return None if "checkpoint" in parts else info

    with tarfile.open(dst, "w:gz") as tar:
        for name in ("mlflow.db", "mlruns"):
            if (work / name).exists():
                tar.add(work / name, arcname=name, filter=keep)


def markdown(data: dict) -> str:
    e = data["env"]
    md = [f"### {e['date']} · {e['device']} · torch {e['torch']} · commit {e['commit']}", "",
          (f"`benchmarks/rehearsal.py --smoke`: the smoke profile on a CPU (the script's path, not a figure). "
           if data.get("smoke") else
           f"`benchmarks/rehearsal.py`: the whole study rehearsed on one GPU (full profile, random "
           f"1.7B, overrides {', '.join(f'`{k}={v}`' for k, v in data['overrides'].items())}; "
           f"the two-process arms' ranks share the GPU over gloo: speed and cost are not the study's). ")
          +
          f"Whole study {data.get('whole_s', 0):.0f} s.", "",
          "| step | seconds | exit |", "|---|---|---|"]
    md += [f"| {k} | {v['s']:.0f} | {v['rc']} |" for k, v in data["steps"].items()]
    md += ["", "| arm | status | " + " | ".join(f"{p} s" for p in data["arms"] and next(
        (a["phases_s"] for a in data["arms"].values() if "phases_s" in a), {})) +
        " | median s/update | peak GiB per rank (allocated / reserved) | checkpoint bytes |"]
    phases = next((list(a["phases_s"]) for a in data["arms"].values() if "phases_s" in a), [])
    md.append("|---|---|" + "---|" * len(phases) + "---|---|---|")
    for arm, a in data["arms"].items():
        if "phases_s" not in a:
            md.append(f"| {arm} | {a['status']} |" + " - |" * (len(phases) + 3))
            continue
        ph = " | ".join("-" if a["phases_s"][p] is None else f"{a['phases_s'][p]:.1f}" for p in phases)
        peaks = "; ".join(f"rank {r}: {al:.1f} / {re:.1f}" for r, (al, re) in a["peaks_gib"].items()) or "-"
        med = f"{a['median_step_s']:.3f}" if a["median_step_s"] else "-"
        status = a["status"] + (f" ({a['reason']})" if a.get("reason") else "")
        md.append(f"| {arm} | {status} | {ph} | {med} | {peaks} | {a['ckpt_bytes'] or 0:,.0f} |")
    if data.get("scored"):
        md += ["", "| scored model | load s | generation s (test cases) | NLL s (probes) |", "|---|---|---|---|"]
        md += [f"| {k} | {v['load_s'] or 0:.1f} | {v['test_s'] or 0:.1f} | {v['retention_s'] or 0:.1f} |"
               for k, v in data["scored"].items()]
    return "\n".join(md) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", help="run the rehearsal here (a fresh folder on a disk with ~40 GB free)")
    ap.add_argument("--smoke", action="store_true",
                    help="the smoke profile on a CPU, no rehearsal: checks this script's path in minutes")
    ap.add_argument("--set", action="append", default=[], metavar="CONCERN.FIELD=VALUE",
                    help="another plan override for the rehearsal (recorded in the result)")
    ap.add_argument("--table", help="print the table of this rehearsal.json instead of running")
    ap.add_argument("--benchmarks-md", help="with --table: append it to this file")
    args = ap.parse_args(argv)
    if args.table:
        md = markdown(json.loads(Path(args.table).read_text()))
        if args.benchmarks_md:
            with open(args.benchmarks_md, "a") as fh:
                fh.write("\n" + md)
        print(md)
        return
    if not args.work:
        ap.error("--work DIR (to run) or --table FILE (to print a result)")
    print(markdown(run(Path(args.work), args.smoke, args.set)))


if __name__ == "__main__":
    main()
