"""Shared fixtures: a real `mlflow server` on 127.0.0.1 (SQLite backend, served
artifacts), and small studies run through the real entry points.

The small plan keeps the study's shape (families, arms, warm-up, rank 32, global
normalisation) but shrinks the counts so that the suite runs on 2 CPU cores.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from gradshare.train.driver import free_port

REPO = Path(__file__).resolve().parents[1]

# 4 x 12 + 16 = 64 = 8 updates x 8 documents; compression from update 3.
SMALL = {
    "data.train_per_family": "12", "data.test_per_family": "8", "data.replay_docs": "16",
    "data.retention_probes": "8", "data.pretrain_docs": "32", "schedule.updates": "8",
    "schedule.docs_per_update": "8", "schedule.micro_batch_docs": "2", "model.pretrain_steps": "12",
    "model.vocab_size": "512", "powersgd.warmup_updates": "2", "scoring.max_new_tokens": "8",
}


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real tracking server over HTTP; yields its URI and where it keeps artifacts."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination",
         str(root / "artifacts"), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            if urllib.request.urlopen(uri + "/health", timeout=2).read() == b"OK":
                break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    import mlflow
    mlflow.set_tracking_uri(uri)
    yield SimpleNamespace(uri=uri, artifacts=root / "artifacts")
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old
    proc.terminate()
    proc.wait(timeout=30)


def run_entry(module: str, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m entrypoints.<module>` as a user would, against the test server."""
    proc = subprocess.run([sys.executable, "-m", f"entrypoints.{module}", *args], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                          capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def overrides(extra: dict | None = None) -> list[str]:
    out = []
    for k, v in {**SMALL, **(extra or {})}.items():
        out += [f"--{k}", v]
    return out


def mlflow_run(entry: str, study: str, params: dict, check: bool = True) -> subprocess.CompletedProcess:
    """`mlflow run . -e ENTRY --env-manager local`, exactly the README's way."""
    cmd = [sys.executable, "-m", "mlflow", "run", str(REPO), "-e", entry, "--env-manager", "local",
           "--experiment-name", study, "-P", f"study={study}"]
    for k, v in params.items():
        cmd += ["-P", f"{k}={v}"]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"mlflow run -e {entry} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-5000:]}")
    return proc


def runs(study: str, step: str, arm: str | None = None):
    from gradshare import tracking as T
    return T.search(study, step, arm)


@pytest.fixture(scope="session")
def prepared_study(mlflow_server):
    """A small study prepared through `mlflow run . -e prepare` (the MLproject path)."""
    study = "small-study"
    mlflow_run("prepare", study, SMALL)
    return study


@pytest.fixture(scope="session")
def trained_study(prepared_study):
    """The small study with its three arms trained, one after another."""
    for arm in ("single", "dense", "powersgd"):
        run_entry("train", "--study", prepared_study, "--arm", arm)
    return prepared_study


@pytest.fixture(scope="session")
def failing_study(mlflow_server):
    """A second small study on CPU, for the failure paths (its runs do not disturb the others)."""
    study = "failing-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}))
    return study


@pytest.fixture(scope="session")
def partial_study(mlflow_server):
    """single trained, dense diverged (NaN), powersgd never started; then committed."""
    study = "partial-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "2"}))
    run_entry("train", "--study", study, "--arm", "single")
    run_entry("train", "--study", study, "--arm", "dense", env={"GRADSHARE_INJECT_NAN_AT": "2"}, check=False)
    run_entry("commit", "--study", study)
    return study, commitment_of(study)


def is_scored(study: str) -> bool:
    from gradshare import tracking as T
    return bool(T.finished_score_steps(study))


def commitment_of(study: str) -> dict:
    import json
    from gradshare import tracking as T
    [run] = T.search(study, "commit", status="FINISHED")
    return json.loads(T.download(run.info.run_id, "commitment.json").read_text())


@pytest.fixture(scope="session")
def committed_study(trained_study):
    """The small study, committed once (whichever test asks first)."""
    from gradshare import tracking as T
    if not T.is_committed(trained_study):
        run_entry("commit", "--study", trained_study)
    return trained_study, commitment_of(trained_study)


@pytest.fixture(scope="session")
def scored_study(committed_study):
    study, _ = committed_study
    if not is_scored(study):
        mlflow_run("score", study, {})  # the MLproject path: a launcher run with nested children
    return study


@pytest.fixture(scope="session")
def partial_scored(partial_study):
    study, _ = partial_study
    if not is_scored(study):
        run_entry("score", "--study", study)
    return study
