"""Benchmark: the tiny arms over loopback and across two emulated hosts at three link rates,
with the projection of this machine (`gradshare.cost.link`) beside each measurement.

    sudo python benchmarks/link_rates.py --out link_rates.json          # ~15 min on 2 cores
    python benchmarks/link_rates.py --refit link_rates.json --fit-rate 11   # re-project a saved result
    python benchmarks/link_rates.py --log link_rates.json --benchmarks-md BENCHMARKS.md
        # log a result file to MLflow ($MLFLOW_TRACKING_URI or sqlite:///mlflow.db, experiment
        # gradshare-benchmarks) and append its table to BENCHMARKS.md

One tiny study per link (the tiny profile with 24 updates and a short seed pre-training:
speed does not depend on the weights), each in a SQLite store of its own under a temporary
directory (a file both namespaces see):
  - loopback: single, dense and powersgd with both ranks on one host; these give the
    projection its inputs: one device's update (single), each arm's own seconds beyond
    compute (no link at all) and its logical bytes per update;
  - at each rate: dense and powersgd across two emulated hosts (`gradshare.steps.emulated`), the
    rate shaped with tc tbf in each direction.
The projection's c1, x(arm) and B(arm) come from the loopback study; each arm's link efficiency
e(arm) (how much of the shaped rate TCP gives its all-reduce) from its run at the fit rate, the
plan's link, alone. The other rates are predictions, checked against their runs (the issue's
10%). The measured s/update is the median over updates after warm-up (powersgd) or after update 2 (dense), as the
projection's inputs are. Root, `ip` and `tc` are needed (the script says so otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from gradshare.tracking import connection
from gradshare.tracking import study_runs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

UPDATES = 24
# 4 families x 160 + 128 replay = 768 documents = 24 updates x 32
OVERRIDES = {"data.train_per_family": "160", "data.replay_docs": "128", "schedule.updates": str(UPDATES),
             "model.pretrain_steps": "10", "data.test_per_family": "8", "data.retention_probes": "8"}
DEFAULT_RATES = (11.0, 22.0, 44.0)  # half, once and twice the plan's link


def _in_store(db: Path):
    import mlflow

    uri = f"sqlite:///{db}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)


def _prepare(study: str, overrides: dict) -> None:
    cmd = [sys.executable, "-m", "entrypoints.prepare", "--study", study]
    for k, v in overrides.items():
        cmd += [f"--{k}", v]
    subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _train_loopback(study: str, arm: str) -> None:
    subprocess.run([sys.executable, "-m", "entrypoints.train", "--study", study, "--arm", arm], cwd=REPO,
                   check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _arm_figures(study: str, arm: str, skip: int) -> dict:
    from gradshare.contract import metrics as M
    [run] = study_runs.search(study, "train", arm, status="FINISHED")
    m, c = run.data.metrics, connection.client()
    step_s = [(h.step, h.value) for h in c.get_metric_history(run.info.run_id, M.STEP_S)]
    post = [v for s, v in step_s if s > skip]
    out = {"run_id": run.info.run_id, "link_rate_mbit": run.data.params.get("link_rate_mbit"),
           "step_s": step_s, "median_s": statistics.median(post),
           "tokens_per_s": [(h.step, h.value) for h in c.get_metric_history(run.info.run_id, M.TOKENS_PER_S)],
           "logical_bytes": [(h.step, h.value) for h in c.get_metric_history(run.info.run_id, M.LOGICAL_BYTES)],
           "active_tokens_per_s": m[M.ACTIVE_TOKENS_PER_S], "process_s": m[M.GPU_S_TOTAL],
           "logical_bytes_total": m.get(M.LOGICAL_BYTES_TOTAL, 0.0)}
    for j in (0, 1):
        if M.host_wire_tx_total(j) in m:
            out[f"host{j}_wire_tx"] = m[M.host_wire_tx_total(j)]
            out[f"host{j}_wire_rx"] = m[M.host_wire_rx_total(j)]
    return out


def run(args) -> dict:
    from gradshare.hosts import netns
    from gradshare.cost import link as P
    from gradshare.steps.emulated import run_arm_across
    from gradshare.contract.plan import load_plan

    reason = netns.unavailable()
    if reason:
        raise SystemExit(f"link_rates: cannot make emulated hosts here: {reason}")
    fit_rate = args.fit_rate
    if fit_rate not in args.rates:
        raise SystemExit(f"link_rates: --fit-rate {fit_rate:g} is not among --rates {args.rates}")
    root = Path(tempfile.mkdtemp(prefix="gradshare-linkbench-"))
    plan = load_plan("tiny", OVERRIDES)
    # every arm of the plan, by its kind: its warm-up (and DDP's first two updates) left out
    skip = {a.name: max(a.warmup_updates, 2) for a in plan.arm_list()}
    across = [a.name for a in plan.arm_list() if a.is_ddp]
    data = {"updates": UPDATES, "overrides": OVERRIDES, "rates_mbit": list(args.rates), "links": {}}
    t0 = time.perf_counter()

    _in_store(root / "loopback.db")
    _prepare("linkbench-loopback", OVERRIDES)
    for arm in plan.arms.names:
        _train_loopback("linkbench-loopback", arm)
    data["links"]["loopback"] = {arm: _arm_figures("linkbench-loopback", arm, skip[arm]) for arm in plan.arms.names}
    for rate in args.rates:
        study = f"linkbench-{rate:g}mbit"
        _in_store(root / f"{study}.db")
        _prepare(study, {**OVERRIDES, "link.rate_mbit": f"{rate:g}"})
        got = {}
        for arm in across:
            if not run_arm_across(study, arm, rate, plan.arms.timeout_s(UPDATES) + 300):
                raise SystemExit(f"link_rates: arm {arm} at {rate:g} Mbit/s failed")
            got[arm] = _arm_figures(study, arm, skip[arm])
        data["links"][f"{rate:g}"] = got
    data["wall_s"] = time.perf_counter() - t0
    data["env"] = _env()
    return project(data, fit_rate)


def project(data: dict, fit_rate: float) -> dict:
    """`data` with the projection of this machine beside each measurement: c1, x(arm) and B(arm)
    from the loopback runs; each arm's link efficiency e(arm) fitted on its run at `fit_rate`; every
    other rate is then a prediction the runs at that rate never fed (`gradshare.cost.link`)."""
    from gradshare.cost import link as P
    from gradshare.contract.plan import load_plan

    plan = load_plan("tiny", data["overrides"])
    loopback = P.from_measurements(plan, data["links"]["loopback"], "this machine, from its loopback runs")
    fit_key = f"{fit_rate:g}"
    if fit_key not in data["links"]:
        raise SystemExit(f"link_rates: no runs at the fit rate {fit_key} Mbit/s (have {', '.join(data['links'])})")
    machine = P.with_link_efficiency(loopback, plan, data["links"][fit_key])
    data["fit_rate_mbit"] = fit_rate
    data["inputs"] = {"single_s": machine.single_s,
                      "extra_s": {a: i.extra_s for a, i in machine.arms.items()},
                      "logical_bytes": {a: i.logical_bytes for a, i in machine.arms.items()},
                      "link_efficiency": {a: i.link_efficiency for a, i in machine.arms.items()}}
    for link, arms in data["links"].items():
        if link == "loopback":
            continue
        for arm, got in arms.items():
            got["projected_s"] = P.s_per_update(machine, arm, 2, float(link))
            got["fitted"] = link == fit_key
    return data


def _env() -> dict:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "commit": commit}


def table_rows(data: dict) -> list[dict]:
    single = data["links"]["loopback"]["single"]
    rows = []
    for link, arms in data["links"].items():
        for arm, a in arms.items():
            row = {"link": "loopback" if link == "loopback" else f"{link} Mbit/s", "arm": arm,
                   "active_tokens_per_s": a["active_tokens_per_s"],
                   "speed_ratio": a["active_tokens_per_s"] / single["active_tokens_per_s"],
                   "process_s": a["process_s"], "logical_bytes": a["logical_bytes_total"],
                   "wire_tx": [a.get(f"host{j}_wire_tx") for j in (0, 1)],
                   "measured_s": a["median_s"], "projected_s": a.get("projected_s")}
            row["fitted"] = a.get("fitted", False)
            if row["projected_s"] and not row["fitted"]:
                row["error"] = row["projected_s"] / row["measured_s"] - 1
            rows.append(row)
    return rows


def markdown(data: dict) -> str:
    e = data["env"]
    i = data["inputs"]
    md = [f"### {e['date']} · CPU ({e['cpus']} cores, {e['cpu']}) · torch {e['torch']} · commit {e['commit']}", "",
          f"`benchmarks/link_rates.py`: the tiny profile with {data['updates']} updates, one thread per "
          f"process; two-process arms over loopback and across two emulated hosts (tc tbf, each way, no "
          f"latency). Projection inputs from the loopback runs alone: one device's update "
          f"{i['single_s']:.3f} s; arms' own seconds " + ", ".join(f"{a} {x:+.3f}" for a, x in i["extra_s"].items())
          + "; logical bytes per update " + ", ".join(f"{a} {b:,.0f}" for a, b in i["logical_bytes"].items())
          + "; link efficiency e(arm), fitted on the runs at "
          + f"{data.get('fit_rate_mbit', 22):g} Mbit/s (the plan's link) alone, "
          + ", ".join(f"{a} {x:.2f}" for a, x in i.get("link_efficiency", {}).items())
          + ": the other rates are predictions"
          + f". Medians after update 2 (powersgd: after its warm-up). Whole run {data['wall_s']:.0f} s.", "",
          "| link | arm | active tokens/s | speed ratio vs single | process-s | logical bytes per host | "
          "wire tx host 0 / host 1 | s/update measured | projected | error |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table_rows(data):
        wire = " / ".join(f"{w:,.0f}" if w is not None else "-" for w in r["wire_tx"])
        proj = f"{r['projected_s']:.3f}" if r["projected_s"] else "-"
        err = f"{r['error']:+.1%}" if "error" in r else ("fitted" if r["fitted"] else "-")
        md.append(f"| {r['link']} | {r['arm']} | {r['active_tokens_per_s']:,.0f} | {r['speed_ratio']:.2f} | "
                  f"{r['process_s']:.1f} | {r['logical_bytes']:,.0f} | {wire} | {r['measured_s']:.3f} | {proj} | {err} |")
    return "\n".join(md) + "\n"


def log_to_mlflow(path: Path, experiment: str = "gradshare-benchmarks") -> str:
    import mlflow

    data = json.loads(path.read_text())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"link-rates-{data['env']['commit']}") as run:
        mlflow.log_params({"benchmark": "link_rates", "updates": data["updates"], **data["env"],
                           "rates_mbit": ",".join(map(str, data["rates_mbit"]))})
        for r in table_rows(data):
            key = f"{r['link'].replace(' ', '').replace('/', 'p')}/{r['arm']}"
            mlflow.log_metrics({f"{key}/measured_s": r["measured_s"], f"{key}/speed_ratio": r["speed_ratio"],
                                f"{key}/active_tokens_per_s": r["active_tokens_per_s"]})
            if r["projected_s"]:
                mlflow.log_metric(f"{key}/projected_s", r["projected_s"])
            if "error" in r:
                mlflow.log_metric(f"{key}/error", r["error"])
        mlflow.log_artifact(str(path))
        mlflow.log_text(markdown(data), "table.md")
        return run.info.run_id


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES), help="Mbit/s, comma-separated")
    ap.add_argument("--fit-rate", type=float, default=22.0,
                    help="Mbit/s whose runs fit each arm's link efficiency (the plan's link); the others are predicted")
    ap.add_argument("--refit", help="recompute the projection of this result JSON (e.g. another --fit-rate) and print it")
    ap.add_argument("--out", help="write the result JSON here (and print its table)")
    ap.add_argument("--log", help="log this result JSON to MLflow instead of running")
    ap.add_argument("--benchmarks-md", help="with --log: append the table to this file")
    args = ap.parse_args(argv)
    try:
        args.rates = [float(x) for x in args.rates.split(",")]
    except ValueError:
        ap.error(f"--rates takes Mbit/s separated by commas, got {args.rates!r}")
    if args.refit:
        data = project(json.loads(Path(args.refit).read_text()), args.fit_rate)
        if args.out:
            Path(args.out).write_text(json.dumps(data, indent=1))
        print(markdown(data))
        return
    if args.log:
        run_id = log_to_mlflow(Path(args.log))
        if args.benchmarks_md:
            with open(args.benchmarks_md, "a") as fh:
                fh.write("\n" + markdown(json.loads(Path(args.log).read_text()))
                         + f"\nMLflow: experiment `gradshare-benchmarks`, run `{run_id}`.\n")
        print(f"logged run {run_id}")
        return
    data = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1))
    print(markdown(data))


if __name__ == "__main__":
    main()
