"""Benchmark: the whole study rehearsed on one GPU, through gradshare's own steps, timed.

    python benchmarks/rehearsal.py --work /tmp/rehearsal                 # the study's length: 128 updates,
                                                                         # the full data (~15 min, one H200)
    python benchmarks/rehearsal.py --work /tmp/rehearsal --updates 4     # the short GPU check (~5 min)
    python benchmarks/rehearsal.py --table /tmp/rehearsal/out/rehearsal.json --benchmarks-md BENCHMARKS.md
        # here: print the table of a result (and append it to BENCHMARKS.md)

prepare (full profile, a random 1.7B model, `-P hardware.rehearsal=one-gpu`) -> train single
-> train dense -> train powersgd (both ranks on the one GPU, over gloo) -> commit -> score ->
analyze, each step its real entry point in a process of its own, in a SQLite store under
`--work` (artifacts beside it). Without `--updates` the plan's own schedule and data run: 128
updates of 32 documents, 3,072 tasks and 1,024 replay documents, scored on 1,024 test cases and
128 probes. `--updates N` cuts the schedule to N updates and the training data to fit it (6N
tasks per family, 8N replay documents; PowerSGD's warm-up to N/2 below 16): the short check
that every change to the GPU path runs before it is called done. Its speed and cost are not the
study's (two ranks share one GPU and exchange through host memory): what it measures is the
path itself, start-up, compile, checkpoint, upload and scoring times, and each rank's peak
memory under the 44 GiB cap.

`--harness gpu_path.json` (a `benchmarks/gpu_path.py --only single` result of the same card,
same call) puts the production `single` arm's median s/update over updates 4..N beside the
harness's; `--profile-update U` profiles update U of the production `single` arm
(`gradshare.train.profiling`). The commit recorded is `--commit` (or `$GRADSHARE_COMMIT`), else
this checkout's own HEAD where it is a git checkout of its own: never an enclosing repository's.

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
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gradshare.contract.plan import load_plan  # noqa: E402
from gradshare.contract.tags import ARM, FAILURE, REFUSAL  # noqa: E402
from gradshare.tracking import connection, store, study_runs  # noqa: E402
from gradshare.train.profiling import ENV as PROFILE_ENV  # noqa: E402

STUDY = "rehearsal-one-gpu"
OVERRIDES = {"hardware.rehearsal": "one-gpu"}
ARMS = load_plan("full").arms.names  # the study's own arms, in its order: a row added to the plan is rehearsed too
HARNESS_CONFIG = "single"  # gpu_path.py's configuration of the study's one-GPU arm
STEADY_FROM = 4  # the median s/update is over updates 4..N, as benchmarks/gpu_path.py takes it


def cut_to(updates: int) -> dict:
    """The plan overrides of a rehearsal cut to `updates` updates of 32 documents: the training
    data made to fit (three tasks to one replay document, as in the study), PowerSGD's warm-up
    kept below the schedule's length."""
    if updates < 3:
        raise SystemExit(f"--updates {updates}: at least 3 (PowerSGD compresses after a warm-up of at least 2)")
    return {"schedule.updates": str(updates), "data.train_per_family": str(6 * updates),
            "data.replay_docs": str(8 * updates), "powersgd.warmup_updates": str(min(8, max(2, updates // 2)))}


def _overrides(smoke: bool, extra: list[str], updates: int | None = None) -> dict:
    """The rehearsal's plan overrides: the one-GPU switch, the cut to `updates` (None: the plan's
    own length and data), and any `concern.field=value` given with --set (say why in the result:
    e.g. `hardware.cuda_graphs=false` to fit two ranks on an 80 GB card)."""
    if smoke:
        return {}
    return OVERRIDES | (cut_to(updates) if updates else {}) | dict(x.split("=", 1) for x in extra)


def _steps(overrides: dict, smoke: bool, arms: tuple[str, ...] = ARMS) -> list[tuple[str, list[str]]]:
    prep = ["prepare", "--study", STUDY, "--profile", "smoke" if smoke else "full", "--new-study", "true"]
    for k, v in overrides.items():
        prep += [f"--{k}", v]
    return ([("prepare", prep)] + [(f"train {arm}", ["train", "--study", STUDY, "--arm", arm]) for arm in arms]
            + [(step, [step, "--study", STUDY]) for step in ("commit", "score", "analyze")])


def run(work: Path, smoke: bool = False, extra: list[str] = (), updates: int | None = None,
        commit: str | None = None, profile_update: int = 0, harness: Path | None = None,
        arms: tuple[str, ...] = ARMS) -> dict:
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "GRADSHARE_OUTBOX": str(work / "outbox"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    overrides = _overrides(smoke, list(extra), updates)
    data = {"study": STUDY, "overrides": overrides, "smoke": smoke, "steps": {}, "env": _env(commit),
            "updates": updates, "harness": _harness(harness) if harness else None, "arms_run": list(arms)}
    t_all = time.perf_counter()
    for name, args in _steps(overrides, smoke, arms):
        t0 = time.perf_counter()
        print(f"[rehearsal] {name} ...", flush=True)
        step_env = env | ({PROFILE_ENV: str(profile_update)} if profile_update and name == "train single" else {})
        done = subprocess.run([sys.executable, "-m", f"entrypoints.{args[0]}", *args[1:]], cwd=work, env=step_env)
        data["steps"][name] = {"s": time.perf_counter() - t0, "rc": done.returncode}
        print(f"[rehearsal] {name}: rc {done.returncode}, {data['steps'][name]['s']:.0f} s", flush=True)
        (out / "rehearsal.json").write_text(json.dumps(data, indent=1))  # partial results survive a cut
        if name == "prepare" and done.returncode != 0:
            break
    data["whole_s"] = time.perf_counter() - t_all
    os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_URI",)})
    data |= _from_store(out)
    (out / "rehearsal.json").write_text(json.dumps(data, indent=1))
    (out / "rehearsal.md").write_text(markdown(data))
    _pack(work, out / "store.tar.gz")
    (out / "done").write_text("")
    return data


def own_commit(repo: Path = REPO) -> str:
    """This checkout's HEAD (with `-dirty` where its tracked files differ), only where `repo` is
    the top of a git checkout: a copy inside another repository names none, never that one's."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=repo, capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo.resolve():
        return "unknown (not a git checkout of its own: pass --commit)"
    return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=repo,
                          capture_output=True, text=True).stdout.strip()


def _env(commit: str | None = None) -> dict:
    import torch
    import transformers

    return {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
            "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "commit": commit or os.environ.get("GRADSHARE_COMMIT") or own_commit()}


def _harness(path: Path) -> dict:
    """The harness's `single` on the same workload: its median s/update (updates 4..N-1, as
    gpu_path.py summarises) and peaks, from a gpu_path.py result file."""
    data = json.loads(Path(path).read_text())
    single = next((r for r in data.get("results", []) if r["config"] == HARNESS_CONFIG), {})
    return {"file": str(path), "commit": data.get("env", {}).get("commit"), "updates": data.get("env", {}).get("updates"),
            **{k: (single.get("summary") or {}).get(k) for k in ("step_s", "peak_reserved_gib", "tokens_per_s")},
            "error": single.get("error") or single.get("failure_reason")}


def median_steady(history: list[tuple[int, float]]) -> float | None:
    """The median of (update, seconds) over updates STEADY_FROM.. (all of them where the run is shorter)."""
    steady = [s for u, s in history if u >= STEADY_FROM] or [s for _, s in history]
    return statistics.median(steady) if steady else None


def _from_store(out: Path | None = None) -> dict:
    """Each arm's outcome, phases and peaks; each scored model's seconds; the single arm's profile."""
    from gradshare.contract import metrics as M
    _, plan = store.prepared_plan(STUDY)
    arms = {}
    for arm in ARMS:
        runs = [r for r in study_runs.search(STUDY, "train", arm) if r.data.tags.get(REFUSAL) != "true"]
        if not runs:
            arms[arm] = {"status": "not run"}
            continue
        r = runs[-1]
        m = r.data.metrics
        steps = sorted((x.step, x.value) for x in connection.client().get_metric_history(r.info.run_id, M.STEP_S))
        losses = [x.value for x in sorted(connection.client().get_metric_history(r.info.run_id, M.TRAIN_LOSS),
                                          key=lambda x: x.step)]
        arms[arm] = {"status": r.info.status, "reason": r.data.tags.get(FAILURE),
                     "phases_s": {p: m.get(M.phase_s(p)) for p in M.PHASES},
                     "wall_s": m.get(M.WALL_S), "median_step_s": median_steady(steps), "steps_s": [v for _, v in steps],
                     "losses": losses, "updates": len(steps), "ckpt_bytes": m.get(M.CKPT_BYTES),
                     "peaks_gib": {rank: (m.get(M.peak_allocated_gib(rank)), m.get(M.peak_reserved_gib(rank)))
                                   for rank in range(2) if M.peak_reserved_gib(rank) in m},
                     "replica_tensors": m.get(M.REPLICA_TENSORS), "processes": plan.arms.processes(arm),
                     "warmup_updates": plan.arm(arm).warmup_updates}
    scored = {}
    for r in study_runs.search(STUDY, "score"):
        if ARM in r.data.tags:
            m = r.data.metrics
            scored[r.data.tags[ARM]] = {k: m.get(v) for k, v in (("load_s", M.SCORE_LOAD_S),
                                                                   ("test_s", M.SCORE_TEST_S),
                                                                   ("retention_s", M.SCORE_RETENTION_S))}
    single = [r for r in study_runs.search(STUDY, "train", "single") if r.data.tags.get(REFUSAL) != "true"]
    if out is not None and single:
        try:  # where the single arm was profiled (--profile-update)
            (out / "profile_single.txt").write_text(
                study_runs.read_text(single[-1].info.run_id, "profile/profile.rank0.txt"))
        except Exception:  # noqa: BLE001 - not profiled: nothing to fetch
            pass
    return {"arms": arms, "scored": scored}


def loss_agreement(arms: dict) -> list[str]:
    """The same updates by two arms that compute the same function: dense and single on every
    update, powersgd and dense over its plain warm-up (bf16 autocast: ~1e-3 is rounding)."""
    losses = {a: v.get("losses") or [] for a, v in arms.items()}
    out = []
    for a, b, upto in (("dense", "single", None), ("powersgd", "dense", "warmup")):
        n = min(len(losses.get(a, [])), len(losses.get(b, [])))
        if upto == "warmup":
            n = min(n, arms.get(a, {}).get("warmup_updates") or 0)
        if n:
            worst = max(abs(x - y) / abs(y) for x, y in zip(losses[a][:n], losses[b][:n]))
            out.append(f"{a} vs {b} over updates 1..{n}: {worst:.1e}")
    return out


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
    length = (f"cut to {data['updates']} updates" if data.get("updates") else "the plan's length and data")
    md = [f"### {e['date']} · {e['device']} · torch {e['torch']} · transformers {e.get('transformers', '?')} · "
          f"commit {e['commit']} · {length}", "",
          ("`benchmarks/rehearsal.py --smoke`: the smoke profile on a CPU (the script's path, not a figure). "
           if data.get("smoke") else
           f"`benchmarks/rehearsal.py`: the whole study rehearsed on one GPU (full profile, random "
           f"1.7B, overrides {', '.join(f'`{k}={v}`' for k, v in data['overrides'].items())}; "
           f"the two-process arms' ranks share the GPU over gloo: speed and cost are not the study's). ")
          +
          f"Whole study {data.get('whole_s', 0):.0f} s.", "",
          "| step | seconds | exit |", "|---|---|---|"]
    md += [f"| {k} | {v['s']:.0f} | {v['rc']} |" for k, v in data["steps"].items()]
    phases = next((list(a["phases_s"]) for a in data["arms"].values() if "phases_s" in a), [])
    md += ["", "| arm | status | updates | " + " | ".join(f"{p} s" for p in phases) +
           f" | median s/update ({STEADY_FROM}..N) | peak GiB per rank (allocated / reserved) | replicas | "
           f"checkpoint bytes |"]
    md.append("|---|---|---|" + "---|" * len(phases) + "---|---|---|---|")
    for arm, a in data["arms"].items():
        if "phases_s" not in a:
            md.append(f"| {arm} | {a['status']} |" + " - |" * (len(phases) + 5))
            continue
        ph = " | ".join("-" if a["phases_s"][p] is None else f"{a['phases_s'][p]:.1f}" for p in phases)
        peaks = "; ".join(f"rank {r}: {al:.1f} / {re:.1f}" for r, (al, re) in a["peaks_gib"].items()) or "-"
        med = f"{a['median_step_s']:.3f}" if a["median_step_s"] else "-"
        status = a["status"] + (f" ({a['reason']})" if a.get("reason") else "")
        replicas = f"{a['replica_tensors']:.0f} tensors agree" if a.get("replica_tensors") and a.get("processes", 1) > 1 \
            else "-"
        md.append(f"| {arm} | {status} | {a.get('updates', '-')} | {ph} | {med} | {peaks} | {replicas} | "
                  f"{a['ckpt_bytes'] or 0:,.0f} |")
    h, single = data.get("harness"), data["arms"].get("single", {})
    if h and h.get("step_s") and single.get("median_step_s"):
        ratio = single["median_step_s"] / h["step_s"]
        md += ["", f"Production `single` against the harness on the same card (`benchmarks/gpu_path.py --only "
                   f"single --updates {h.get('updates')}`, commit {h.get('commit')}): "
                   f"{single['median_step_s']:.3f} s/update against {h['step_s']:.3f} ({ratio:.2f}x; reserved peak "
                   f"{h.get('peak_reserved_gib') or 0:.1f} GiB in the harness)."]
    elif h:
        md += ["", f"Harness: no figure ({h.get('error') or 'no single result'})."]
    if agree := loss_agreement(data["arms"]):
        md += ["", "Losses of the same updates by arms that compute the same function (largest relative "
                   "difference): " + "; ".join(agree) + "."]
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
    ap.add_argument("--updates", type=int, help="cut the schedule to this many updates and the data to fit "
                                                  "(the short GPU check: 4); default the plan's own 128")
    ap.add_argument("--commit", help="the commit this tree is (default $GRADSHARE_COMMIT, else this checkout's)")
    ap.add_argument("--profile-update", type=int, default=0, help="profile this update of the single arm")
    ap.add_argument("--harness", help="a benchmarks/gpu_path.py result of the same card: its single beside the arm's")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help="the arms to train (default all three; on an 80 GB card two PowerSGD ranks do not fit: "
                         "single,dense), the others recorded as not run")
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
    arms = tuple(a for a in args.arms.split(",") if a)
    if not arms or set(arms) - set(ARMS):
        ap.error(f"--arms {args.arms!r}: a comma-separated subset of {', '.join(ARMS)}")
    print(markdown(run(Path(args.work), args.smoke, args.set, args.updates, args.commit, args.profile_update,
                       Path(args.harness) if args.harness else None, arms)))


if __name__ == "__main__":
    main()
