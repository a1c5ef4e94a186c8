"""The train step around the worker processes: claim, fetch and verify, launch, record.

Runs inside the arm's MLflow run (see `entrypoints.train`). Refusals come first and
cost nothing (a machine without the devices, a bad launch): the run is tagged a
refusal, not an attempt. Then the arm is claimed in the study's ledger
(`gradshare.claims`), which refuses once the study is committed, while another arm
runs, after the arm finished, or when the plan's `arms.max_attempts` are used up; a
claim that succeeds is attempt N of the arm (tag `gradshare.attempt`). Only then are
the train inputs (never the test set) downloaded and checked byte for byte against the
manifest, the worker processes launched with `accelerate launch` and waited for at most
the plan's timeout, and the summary, the step-128 checkpoint and its SHA-256 recorded.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gradshare import claims
from gradshare import limits
from gradshare import metering
from gradshare import metrics as M
from gradshare import store
from gradshare import tracking as T
from gradshare.hashing import sha256_text
from gradshare.outbox import Outbox
from gradshare.plan import Plan

RESUMED = "gradshare.resumed_from_update"  # the updates a run was resumed after, comma-separated
# Seconds between asking the arm's processes to stop (SIGTERM) and killing them.
STOP_GRACE_S = 10


@dataclass(frozen=True)
class Launch:
    """Multi-node settings passed through to `accelerate launch` (one host by default)."""
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: int = 0  # 0: pick a free port (one host only)


def check_devices(plan: Plan, arm: str, launch: Launch) -> None:
    need = plan.arms.processes(arm)
    if plan.hardware.device != "cuda":
        return
    import torch  # here, not above: on CPU the driver never loads torch (about 2 s per arm)

    if need % launch.num_machines:
        raise T.Refusal(f"arm {arm} needs {need} GPUs, which do not split over "
                        f"{launch.num_machines} machines")
    per_host, have = need // launch.num_machines, torch.cuda.device_count()
    if have < per_host:
        raise T.Refusal(
            f"arm {arm} needs {need} CUDA device(s) ({per_host} on this host with num_machines="
            f"{launch.num_machines}), found {have}: run it on a host with {per_host} GPU(s) or pass "
            f"the second host with -P num_machines=2 -P main_process_ip=HOST")


def claim_arm(prep, plan: Plan, arm: str, own_run_id: str) -> int:
    """Take the arm's start in the study's ledger; returns the attempt number or refuses."""
    if arm not in plan.arms.names:
        raise T.Refusal(f"arm {arm!r} is not in the plan's arms {list(plan.arms.names)}")
    index = claims.append(prep.info.run_id, "train", arm, own_run_id)
    return claims.decide_train(claims.entries(prep.info.run_id, before=index), arm, plan.arms.max_attempts)


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
        cmd += ["--cpu"]
    threads = plan.hardware.threads_per_process
    if threads > 0:  # every process of every arm the same: one device means the same in each arm
        cmd += ["--num_cpu_threads_per_process", str(threads)]
    elif n == 1 and plan.hardware.device == "cpu":
        cmd += ["--num_cpu_threads_per_process", str(os.cpu_count() or 1)]
    return cmd + ["-m", "gradshare.train.worker", "--workdir", str(workdir), "--arm", arm,
                  "--run-id", run_id]


def thread_env(plan: Plan) -> dict[str, str]:
    """Thread-pool sizes for the workers' native libraries (accelerate sets only OMP's)."""
    n = plan.hardware.threads_per_process
    return {k: str(n) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")} if n > 0 else {}


def stop_tree(pid: int, grace_s: float = STOP_GRACE_S) -> None:
    """End a process and every descendant: SIGTERM, then SIGKILL after `grace_s`.

    The descendants are listed before anything is signalled: torch's elastic launcher
    starts each rank in a session of its own, so a process-group kill would miss them, and
    a rank whose launcher has died is re-parented away from this tree.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def _launch_workers(plan: Plan, arm: str, workdir: Path, run_id: str, launch: Launch) -> None:
    cmd = launch_command(plan, arm, workdir, run_id, launch)
    limit = plan.arms.timeout_s(plan.schedule.updates)
    print(f"[gradshare] launching (time limit {limit:.0f}s):", " ".join(cmd), flush=True)
    from gradshare import outbox

    # the workers keep their records where this step looks for them (`gradshare.outbox`)
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1", **thread_env(plan),
                                          **{outbox.ENV: str(outbox.root())}))
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid)
        a = plan.arms
        raise T.StudyError(
            f"timeout: arm {arm} did not finish within {limit:.0f}s (arms.startup_s {a.startup_s:g} + "
            f"{plan.schedule.updates} updates x arms.expected_update_s {a.expected_update_s:g} x "
            f"arms.timeout_margin {a.timeout_margin:g}); every rank was stopped. A rank hung or the "
            f"hardware is slower than planned: raise arms.expected_update_s at prepare") from None
    finally:  # an interrupt or error in this process must not leave ranks behind
        if proc.poll() is None:
            stop_tree(proc.pid)
    if rc != 0:
        reasons = [p.read_text().strip() for p in sorted(workdir.glob("failure.rank*.txt"))]
        reason = (reasons[0] if reasons else
                  f"arm {arm}: a worker process exited with code {rc} and left no reason; see the run's log")
        if run_id and not reason.startswith(("deadline:", "budget:", "tracking:")):  # those say it already
            reason += f"; last completed update {_last_update(run_id)} of {plan.schedule.updates}"
        raise T.StudyError(reason)


def _verified_workdir(prep, plan: Plan, tmp: Path) -> Path:
    workdir = store.verified_inputs(prep, plan, tmp, store.TRAIN_INPUTS)
    (workdir / "plan.json").write_text(json.dumps(plan.to_dict() | {"plan_sha256": plan.sha256()}))
    return workdir


def check_launch(launch: Launch, full_state_every: int = 0) -> None:
    """The entry point's launch check (`train.launch.launch_problem`), again inside the run, for
    any caller that reaches the driver another way."""
    from gradshare.train.launch import launch_problem

    values = {"num_machines": launch.num_machines, "machine_rank": launch.machine_rank,
              "main_process_port": launch.main_process_port, "full_state_every": full_state_every}
    if problem := launch_problem(values):
        raise T.Refusal(problem[1])


def link_description(plan: Plan, arm: str, launch: Launch) -> str:
    """What carried the arm's exchange: the launcher's word (`GRADSHARE_LINK`, set by the
    study and `scripts/two_hosts.py`) where given, else what the launch shows."""
    from gradshare.emulated import LINK_ENV

    if plan.arms.processes(arm) == 1:
        return "none: one process"
    if os.environ.get(LINK_ENV):
        return os.environ[LINK_ENV]
    if launch.num_machines > 1:
        return f"network: {launch.num_machines} hosts, main host {launch.main_process_ip}"
    return "loopback: both ranks on one host, no byte crossed a link"


def link_rate(plan: Plan, arm: str, launch: Launch) -> str:
    """The link's rate in Mbit/s as the projection reads it: a number for an emulated link,
    `inf` for loopback, `none` for one process, `unknown` for a real network."""
    from gradshare.emulated import RATE_ENV

    if plan.arms.processes(arm) == 1:
        return "none"
    if os.environ.get(RATE_ENV):
        return os.environ[RATE_ENV]
    return "unknown" if launch.num_machines > 1 else "inf"


@dataclass(frozen=True)
class Resume:
    """A stopped attempt to continue in its own run, from its last full state (verified)."""
    run_id: str
    state_dir: Path
    manifest: dict
    spent_usd: float  # what the attempt cost before it stopped (its run is reopened)


def latest_full_state(run_id: str) -> str | None:
    """Artifact path of the run's newest complete full state (`full_state/uNNNNN` with a manifest)."""
    from gradshare.train.fullstate import MANIFEST

    c = T.client()
    dirs = sorted((a.path for a in c.list_artifacts(run_id, "full_state") if a.is_dir), reverse=True)
    for d in dirs:
        if any(a.path.endswith("/" + MANIFEST) for a in c.list_artifacts(run_id, d)):
            return d
    return None


def check_resume(study: str, arm: str, run_id: str) -> Resume:
    """Everything a resume needs, before the stopped run is reopened; a Refusal otherwise."""
    from gradshare.train import fullstate

    prep, plan = store.prepared_plan(study)
    try:
        run = T.client().get_run(run_id)
    except Exception:  # noqa: BLE001 - any lookup failure is a run that is not there
        raise T.Refusal(f"resume_from={run_id}: no such run") from None
    if run.data.tags.get(T.STUDY) != study or run.data.tags.get(T.ARM) != arm:
        raise T.Refusal(f"resume_from={run_id} is not a train run of arm {arm} in study {study!r}")
    if run.info.status not in ("FAILED", "KILLED"):
        raise T.Refusal(f"resume_from={run_id} is {run.info.status}: only a stopped (FAILED or KILLED) arm resumes")
    index = claims.append(prep.info.run_id, "resume", arm, run_id)
    claims.decide_resume(claims.entries(prep.info.run_id, before=index), arm, run_id)
    path = latest_full_state(run_id)
    if path is None:
        raise T.Refusal(f"run {run_id} saved no complete full state (train with -P full_state_every=N): "
                        f"nothing to resume from")
    local = T.download(run_id, path, Path(tempfile.mkdtemp(prefix="gradshare-resume-")))
    try:
        manifest = fullstate.verify(local, plan.arms.processes(arm))
    except fullstate.FullStateError as exc:
        raise T.Refusal(f"the full state {path} of run {run_id} is refused: {exc}") from None
    return Resume(run_id, local, manifest, limits.run_spend(plan, run))


def run_arm(study: str, arm: str, run, launch: Launch = Launch(), full_state_every: int = 0,
            resume: Resume | None = None) -> dict:
    """The whole train step for one arm inside its MLflow run (machine rank 0); with `resume`,
    the stopped attempt's own run, reopened, continuing from its full state."""
    import mlflow

    prep, plan = store.prepared_plan(study)
    mlflow.set_tags({T.PLAN_SHA: plan.sha256(), "gradshare.prepare_run_id": prep.info.run_id})
    check_launch(launch, full_state_every)
    check_devices(plan, arm, launch)
    if resume is None:
        attempt = claim_arm(prep, plan, arm, run.info.run_id)
        done = 0
    else:
        attempt = int(run.data.tags.get(T.ATTEMPT, "1"))
        done = resume.manifest["update"]
    # the deadline and the bound: a refusal (no attempt) where the arm's projection passes either
    arm_limits = limits.before_arm(study, prep, plan, arm, own_run_id=run.info.run_id,
                                   updates_left=plan.schedule.updates - done,
                                   extra_spent=resume.spent_usd if resume else 0.0)
    if resume is None:
        mlflow.set_tags({T.ATTEMPT: str(attempt), "mlflow.runName": f"train-{arm}-attempt{attempt}"})
        print(f"[gradshare] arm {arm}: attempt {attempt} of at most {plan.arms.max_attempts}", flush=True)
        mlflow.log_params({"arm": arm, "processes": plan.arms.processes(arm), "device": plan.hardware.device,
                           "num_machines": launch.num_machines, "machine_rank": launch.machine_rank,
                           "main_process_ip": launch.main_process_ip, "attempt": attempt,
                           "timeout_s": plan.arms.timeout_s(plan.schedule.updates),
                           "link": link_description(plan, arm, launch),
                           "link_rate_mbit": link_rate(plan, arm, launch), "full_state_every": full_state_every})
    else:
        before = run.data.tags.get(RESUMED, "")
        mlflow.set_tags({RESUMED: f"{before},{done}" if before else str(done),
                         "mlflow.runName": f"train-{arm}-attempt{attempt}",
                         "gradshare.resumed_full_state_bytes": str(resume.manifest["bytes"])})
        print(f"[gradshare] arm {arm}: attempt {attempt} resumed after update {done} from its full state "
              f"({resume.manifest['bytes']:,} bytes)", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-"))
    try:
        workdir = _verified_workdir(prep, plan, tmp)
        arm_limits.write(workdir)
        (workdir / "fullstate.json").write_text(json.dumps({"every": full_state_every}))
        if resume is not None:
            shutil.copytree(resume.state_dir, workdir / "resume")
        try:
            _launch_workers(plan, arm, workdir, run.info.run_id, launch)
        except KeyboardInterrupt as exc:  # the workers are stopped by now: say how far the arm got
            raise KeyboardInterrupt(f"{str(exc) or 'stopped by the user (interrupt)'}; last completed update "
                                    f"{_last_update(run.info.run_id)} of {plan.schedule.updates}") from None
        summary = json.loads((workdir / "summary.json").read_text())
        # Through the run's outbox, as the workers' records went: with the server gone, the
        # summary and the checkpoint wait on local disk beside the updates' metrics.
        box = Outbox(run.info.run_id, plan.arms.tracking_grace_s)
        box.metrics(summary["metrics"])
        box.text("\n".join(summary["update_sha256"]) + "\n", "schedule/update_sha256.txt")
        box.tags({"gradshare.schedule_sha256": sha256_text("\n".join(summary["update_sha256"]))})
        before = metering.host_counters()
        box.artifacts(workdir / "checkpoint", "checkpoint")
        # The checkpoint's transfer to the artifact store is wire traffic of the arm too (a
        # loopback copy here, 3.4 GB to S3 on the study's hosts): its own line.
        moved = metering.delta(before, metering.host_counters())
        box.metrics({M.wire_tx_bytes("upload"): moved["wire_tx"], M.wire_rx_bytes("upload"): moved["wire_rx"],
                     M.loopback_bytes("upload"): moved["lo_tx"]})
        box.tags({T.CKPT_SHA: summary["checkpoint_sha256"]})
        box.text(json.dumps({"hosts": summary["hosts"], "losses": summary["losses"]}, indent=2),
                 "train_summary.json")
        box.wait(f"after all {plan.schedule.updates} updates")  # the server's last chance within the grace
        return summary
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _last_update(run_id: str) -> int:
    """The arm's last update with logged metrics: from the server, or, where it does not answer,
    from the run's outbox journal."""
    from gradshare import outbox

    try:
        with outbox.fast_fail():
            return max((m.step for m in T.client().get_metric_history(run_id, M.STEP_S)), default=0)
    except Exception:  # noqa: BLE001 - the journal holds every update's metrics too
        return Outbox(run_id, 0).last_step(M.STEP_S)


def run_secondary_host(study: str, arm: str, launch: Launch) -> None:
    """Machine rank > 0 of a multi-host arm: verified inputs and workers, no MLflow run of its
    own (rank 0's run records the arm; this host's wire bytes reach it through the group)."""
    prep, plan = store.prepared_plan(study)
    check_launch(launch)
    check_devices(plan, arm, launch)
    tmp = Path(tempfile.mkdtemp(prefix=f"gradshare-train-{arm}-host{launch.machine_rank}-"))
    try:
        _launch_workers(plan, arm, _verified_workdir(prep, plan, tmp), "", launch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
