"""The train step around the worker processes: refuse, fetch and verify, launch, record.

Runs inside the arm's MLflow run (see `entrypoints.train`). It refuses a candidate
once the study is committed and an arm that would overlap another running arm,
downloads only the inputs training needs from the prepare run (never the test set),
checks every byte against the registered manifest, launches the worker processes
with `accelerate launch`, and records the summary, the step-128 checkpoint and its
SHA-256.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gradshare import tracking as T
from gradshare.hashing import file_entries, sha256_file, sha256_text, tree_sha256
from gradshare.plan import Plan, plan_from_dict
from gradshare.prepare import TRAIN_INPUTS


@dataclass(frozen=True)
class Launch:
    """Multi-node settings passed through to `accelerate launch` (one host by default)."""
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: int = 0  # 0: pick a free port (one host only)


def load_prepared_plan(study: str) -> tuple[object, Plan]:
    """The study's prepare run and its plan, checked against the run's plan hash tag."""
    prep = T.prepare_run(study)
    path = T.download(prep.info.run_id, "plan.json")
    raw = json.loads(Path(path).read_text())
    registered = raw.pop("plan_sha256")
    plan = plan_from_dict(raw)
    if plan.sha256() != registered or prep.data.tags.get(T.PLAN_SHA) != registered:
        raise T.StudyError(f"plan.json of prepare run {prep.info.run_id} does not hash to its registered "
                           f"plan_sha256; the study's inputs cannot be trusted: prepare a new study")
    return prep, plan


def fetch_verified_inputs(prep, plan: Plan, workdir: Path, wanted=TRAIN_INPUTS) -> Path:
    """Download `wanted` inputs of the prepare run `prep`; refuse on any byte the manifest
    does not register, and on a local seed model whose files differ from it."""
    manifest = json.loads(T.download(prep.info.run_id, "inputs/manifest.json", workdir).read_text())
    if manifest["plan_sha256"] != plan.sha256():
        raise T.StudyError("inputs/manifest.json belongs to another plan: prepare a new study")
    registered = prep.data.tags.get("gradshare.inputs_sha256")
    if tree_sha256(manifest["files"]) != manifest["inputs_sha256"] or manifest["inputs_sha256"] != registered:
        raise T.StudyError(f"inputs/manifest.json of prepare run {prep.info.run_id} does not hash to the "
                           f"registered gradshare.inputs_sha256; refusing unregistered inputs")

    def chosen(path: str) -> bool:
        return any(path == w or path.startswith(w + "/") for w in wanted)

    entries = {e["path"]: e for e in manifest["files"] if chosen(e["path"])}
    root = workdir / "inputs"
    for w in wanted:  # seed_model/ exists only where prepare built the seed model
        if any(p == w or p.startswith(w + "/") for p in entries):
            # MLflow places the artifact's last path component directly under dst.
            T.download(prep.info.run_id, f"inputs/{w}", root / Path(w).parent)
    got = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    bad = sorted((set(entries) ^ got) | {p for p in set(entries) & got
                                         if sha256_file(root / p) != entries[p]["sha256"]})
    if bad:
        raise T.StudyError(f"input hash mismatch for {', '.join(bad[:5])}: these files differ from the "
                           f"prepare run's manifest; refusing to train on unregistered inputs")
    seed = manifest["seed_model"]
    if seed["kind"] == "local-hf" and "seed_model" in wanted:
        local = file_entries(seed["path"]) if Path(seed["path"]).is_dir() else []
        if local != seed["files"]:
            raise T.StudyError(f"the local seed model {seed['path']} differs from the files prepare "
                               f"registered; refusing to use it")
    return root


def check_devices(plan: Plan, arm: str, launch: Launch) -> None:
    import torch

    need = plan.arms.processes(arm)
    if plan.hardware.device != "cuda":
        return
    if need % launch.num_machines:
        raise T.StudyError(f"arm {arm} needs {need} GPUs, which do not split over "
                           f"{launch.num_machines} machines")
    per_host, have = need // launch.num_machines, torch.cuda.device_count()
    if have < per_host:
        raise T.StudyError(
            f"arm {arm} needs {need} CUDA device(s) ({per_host} on this host with num_machines="
            f"{launch.num_machines}), found {have}: run it on a host with {per_host} GPU(s) or pass "
            f"the second host with -P num_machines=2 -P main_process_ip=HOST")


def check_may_start(study: str, arm: str, own_run_id: str, plan: Plan) -> None:
    if arm not in plan.arms.names:
        raise T.StudyError(f"arm {arm!r} is not in the plan's arms {list(plan.arms.names)}")
    done = [r.info.run_id for r in T.search(study, "train", arm, status="FINISHED") if r.data.tags.get(T.CKPT_SHA)]
    if done:
        raise T.StudyError(f"arm {arm} of study {study!r} already finished (run {done[0]}); each arm trains "
                           f"once, nothing is re-run behind the plan")
    if T.is_committed(study):
        raise T.StudyError(f"study {study!r} is committed: its candidates are sealed and no new "
                           f"train run may start; prepare a new study to train again")
    running = [r.info.run_id for r in T.search(study, "train", status="RUNNING") if r.info.run_id != own_run_id]
    if running:
        raise T.StudyError(f"another arm of study {study!r} is running (run {running[0]}); arms run one "
                           f"after another, never overlapping: wait for it or stop it")


def free_port() -> int:
    """A loopback port nobody listens on now (for rendezvous, servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(plan: Plan, arm: str, workdir: Path, run_id: str, launch: Launch) -> list[str]:
    n = plan.arms.processes(arm)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n),
           "--num_machines", str(launch.num_machines), "--mixed_precision", "no",
           "--dynamo_backend", "no"]
    if n > 1:
        # `--cpu` with several processes starts one process; `--multi_gpu` plus
        # Accelerator(cpu=True) gives real gloo ranks on CPU.
        port = launch.main_process_port or free_port()
        cmd += ["--multi_gpu", "--machine_rank", str(launch.machine_rank),
                "--main_process_ip", launch.main_process_ip, "--main_process_port", str(port)]
    elif plan.hardware.device == "cpu":
        cmd += ["--cpu", "--num_cpu_threads_per_process", str(os.cpu_count() or 1)]
    return cmd + ["-m", "gradshare.train.worker", "--workdir", str(workdir), "--arm", arm,
                  "--run-id", run_id]


def _launch_workers(plan: Plan, arm: str, workdir: Path, run_id: str, launch: Launch) -> None:
    cmd = launch_command(plan, arm, workdir, run_id, launch)
    print("[gradshare] launching:", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
    if rc != 0:
        reasons = [p.read_text().strip() for p in sorted(workdir.glob("failure.rank*.txt"))]
        raise T.StudyError(reasons[0] if reasons else
                           f"arm {arm}: a worker process exited with code {rc} and left no reason; "
                           f"see the run's log")


def _verified_workdir(prep, plan: Plan, tmp: Path) -> Path:
    workdir = fetch_verified_inputs(prep, plan, tmp)
    (workdir / "plan.json").write_text(json.dumps(plan.to_dict() | {"plan_sha256": plan.sha256()}))
    return workdir


def check_launch(launch: Launch) -> None:
    if launch.num_machines > 1 and launch.main_process_port == 0:
        raise T.StudyError("with num_machines > 1 every host must name the same main_process_port: "
                           "pass -P main_process_port=PORT on each host")
    if not 0 <= launch.machine_rank < launch.num_machines:
        raise T.StudyError(f"machine_rank={launch.machine_rank} is not in 0..{launch.num_machines - 1}")


def run_arm(study: str, arm: str, run, launch: Launch = Launch()) -> dict:
    """The whole train step for one arm inside its MLflow run (machine rank 0)."""
    import mlflow

    prep, plan = load_prepared_plan(study)
    mlflow.set_tags({T.PLAN_SHA: plan.sha256(), "gradshare.prepare_run_id": prep.info.run_id})
    check_launch(launch)
    check_may_start(study, arm, run.info.run_id, plan)
    mlflow.log_params({"arm": arm, "processes": plan.arms.processes(arm), "device": plan.hardware.device,
                       "num_machines": launch.num_machines, "machine_rank": launch.machine_rank,
                       "main_process_ip": launch.main_process_ip})
    check_devices(plan, arm, launch)
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-"))
    try:
        workdir = _verified_workdir(prep, plan, tmp)
        _launch_workers(plan, arm, workdir, run.info.run_id, launch)
        summary = json.loads((workdir / "summary.json").read_text())
        mlflow.log_metrics(summary["metrics"])
        mlflow.log_text("\n".join(summary["update_sha256"]) + "\n", "schedule/update_sha256.txt")
        mlflow.set_tag("gradshare.schedule_sha256", sha256_text("\n".join(summary["update_sha256"])))
        mlflow.log_artifacts(str(workdir / "checkpoint"), "checkpoint")
        mlflow.set_tag(T.CKPT_SHA, summary["checkpoint_sha256"])
        mlflow.log_dict({"hosts": summary["hosts"], "losses": summary["losses"]}, "train_summary.json")
        return summary
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_secondary_host(study: str, arm: str, launch: Launch) -> None:
    """Machine rank > 0 of a multi-host arm: verified inputs and workers, no MLflow run of its
    own (rank 0's run records the arm; this host's wire bytes reach it through the group)."""
    prep, plan = load_prepared_plan(study)
    check_launch(launch)
    check_devices(plan, arm, launch)
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-host{launch.machine_rank}-"))
    try:
        _launch_workers(plan, arm, _verified_workdir(prep, plan, tmp), "", launch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
