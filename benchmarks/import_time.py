"""Benchmark: what installing gradshare costs every `mlflow` command, and `gradshare --help`.

    python benchmarks/import_time.py                                  # table on stdout (~1 min)
    python benchmarks/import_time.py --repeats 15 --log --benchmarks-md BENCHMARKS.md
        # also log it to MLflow ($MLFLOW_TRACKING_URI or sqlite:///mlflow.db, experiment
        # gradshare-benchmarks) and append its table to BENCHMARKS.md

Each row is the median wall time of fresh interpreters (`python -c ...`, in turn, so that a
busy machine slows both rows of a pair alike):
  - `import mlflow` with gradshare's plugin registered (MLflow loads it through its entry point,
    as in every process that imports mlflow), and the same with that entry point hidden: both
    run one preamble that wraps `importlib.metadata.entry_points`, and only the second drops
    gradshare's entries from what it returns. The difference is what the plugin costs;
  - `gradshare --help` through the installed console script's code (`entrypoints.cli.main`).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PREAMBLE = """
import importlib.metadata as md
_real = md.entry_points
def _entry_points(**kw):
    found = _real(**kw)
    if HIDE and kw.get("group") == "mlflow.default_experiment_provider":
        return md.EntryPoints(e for e in found if e.name != "gradshare")
    return found
md.entry_points = _entry_points
"""
CASES = {
    "import mlflow, plugin registered": "HIDE = False" + PREAMBLE + "import mlflow\n"
                                        "import sys\nassert 'entrypoints.mlflow_plugin' in sys.modules",
    "import mlflow, plugin hidden": "HIDE = True" + PREAMBLE + "import mlflow\n"
                                    "import sys\nassert 'entrypoints.mlflow_plugin' not in sys.modules",
    "gradshare --help": "import sys\nsys.argv = ['gradshare', '--help']\nfrom entrypoints.cli import main\n"
                        "try:\n    main()\nexcept SystemExit:\n    pass",
}


def once(code: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark case failed:\n{code}\n{proc.stderr[-2000:]}")
    return took


def measure(repeats: int) -> dict:
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for code in CASES.values():  # a first, uncounted round warms the file cache
        once(code)
    for _ in range(repeats):
        for name, code in CASES.items():
            times[name].append(once(code))
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)} for name, t in times.items()}


def env() -> dict:
    import mlflow
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    return {"commit": commit, "python": platform.python_version(), "mlflow": mlflow.__version__,
            "torch": torch.__version__, "cpus": str(__import__("os").cpu_count()),
            "date": time.strftime("%Y-%m-%d")}


def markdown(result: dict) -> str:
    e, rows = result["env"], result["rows"]
    plugin = rows["import mlflow, plugin registered"]["median_s"] - rows["import mlflow, plugin hidden"]["median_s"]
    lines = [f"### {e['date']}: import time of the light processes (commit {e['commit']}, CPU, {e['cpus']} cores, "
             f"Python {e['python']}, mlflow {e['mlflow']}, torch {e['torch']}, {result['repeats']} runs each)", "",
             "| process | median s | min s | max s |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} |" for name, r in rows.items()]
    lines += ["", f"The plugin costs `import mlflow` {plugin:+.2f} s (goal: within 0.3 s); `gradshare --help` "
                  f"takes {rows['gradshare --help']['median_s']:.2f} s (goal: under 1 s).", ""]
    return "\n".join(lines)


def log_to_mlflow(result: dict, experiment: str = "gradshare-benchmarks") -> str:
    import mlflow

    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"import-time-{result['env']['commit']}") as run:
        mlflow.log_params({"benchmark": "import_time", "repeats": result["repeats"], **result["env"]})
        for name, r in result["rows"].items():
            key = name.replace(" ", "_").replace(",", "").replace("-", "")
            mlflow.log_metrics({f"{key}/median_s": r["median_s"], f"{key}/min_s": r["min_s"]})
        mlflow.log_text(json.dumps(result, indent=2), "import_time.json")
        mlflow.log_text(markdown(result), "table.md")
    return run.info.run_id


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--log", action="store_true", help="log the result to MLflow")
    ap.add_argument("--benchmarks-md", type=Path, help="append the table to this file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    result = {"repeats": args.repeats, "rows": measure(args.repeats), "env": env()}
    table = markdown(result)
    print(table)
    if args.log:
        print(f"MLflow run {log_to_mlflow(result)}")
    if args.benchmarks_md:
        with args.benchmarks_md.open("a") as fh:
            fh.write("\n" + table)


if __name__ == "__main__":
    main()
