"""Many clients on one store: the SQLite-backed server that `gradshare server` starts takes
score children and a UI writing and reading at once without a 'database is locked' or any
5xx, and keeps every value; and the study's steps run against a real PostgreSQL server
(when one can be pip-installed here; skipped naming the reason otherwise)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gradshare.contract.plan import load_plan
from gradshare.tracking.server import command
from gradshare.contract.tags import ARM, CKPT_SHA, STEP
from tests.conftest import REPO, free_port, overrides, run_entry, wait_until_serving

pytestmark = pytest.mark.e2e

# 4 client processes x 4 threads = 16 clients at once: 12 score children (3 per process), each
# making RUNS_EACH runs, and 4 UI-like readers. Separate processes, so that the server, not one
# client's GIL, is what they contend for; threads within each, so that 2 cores start them in time.
PROCESSES, WRITERS_PER_PROCESS, READERS_PER_PROCESS, RUNS_EACH = 4, 3, 1, 3
PARAMS, METRIC_KEYS, HISTORY_STEPS, SINGLE_METRICS, TAGS = 8, 12, 10, 3, 4


def _start(cmd: list[str], root: Path) -> tuple[subprocess.Popen, str]:
    """Start `cmd` (an `mlflow server` command line) and wait for /health; returns it and its URI."""
    port = int(cmd[cmd.index("--port") + 1])
    with open(root / "server.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, uri, root / "server.log", timeout_s=180)
    return proc, uri


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- the client processes ------------------------------------------------------------------

def _score_child(client, exp_id: str, parent_id: str, name: str, ops: dict) -> None:
    """What one score child sends, RUNS_EACH times: a nested run, its params, tags, a metric
    batch with history, single metrics, a small artifact, its end."""
    from mlflow.entities import Metric, Param

    for r in range(RUNS_EACH):
        run = client.create_run(exp_id, run_name=f"{name}-{r}", tags={
            "mlflow.parentRunId": parent_id, "gradshare.step": "score", "gradshare.arm": name,
            "load.client": name, "load.index": str(r)})
        rid, now = run.info.run_id, int(time.time() * 1000)
        client.log_batch(rid, params=[Param(f"p{i}", f"{name}/{r}/{i}") for i in range(PARAMS)])
        for i in range(TAGS):
            client.set_tag(rid, f"process.t{i}", f"{name}-{i}")
        client.log_batch(rid, metrics=[Metric(f"score/m{k}", k + s / 100, now, s)
                                       for k in range(METRIC_KEYS) for s in range(HISTORY_STEPS)])
        for i in range(SINGLE_METRICS):
            client.log_metric(rid, f"perf/single{i}_s", float(i), step=0)
        client.log_text(rid, "".join(json.dumps({"case": i, "run": rid}) + "\n" for i in range(50)),
                        "per_case/test.jsonl")
        client.set_terminated(rid, "FINISHED")
        ops["writes"] += 5 + TAGS + SINGLE_METRICS


def _ui_reader(client, exp_id: str, stop: threading.Event, ops: dict) -> None:
    """What the MLflow UI asks while the study runs: run lists, one run, its metric history."""
    while not stop.is_set():
        found = client.search_runs([exp_id], "tags.`gradshare.step` = 'score'",
                                   order_by=["attributes.start_time DESC"], max_results=100)
        ops["reads"] += 1
        for run in found[:3]:
            client.get_run(run.info.run_id)
            client.get_metric_history(run.info.run_id, "score/m0")
            ops["reads"] += 2


def client_process(uri: str, exp_id: str, parent_id: str, process: int) -> None:
    """One client process: WRITERS_PER_PROCESS score children and READERS_PER_PROCESS readers,
    started together; prints one JSON line (operations done, failures with their message)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    stop = threading.Event()
    counts = [{"writes": 0, "reads": 0, "failures": []} for _ in range(WRITERS_PER_PROCESS + READERS_PER_PROCESS)]

    def guarded(fn, *args):
        try:
            fn(*args)
        except Exception as exc:  # every failure is reported, none is retried away
            args[-1]["failures"].append(f"{type(exc).__name__}: {str(exc)[:300]}")

    writers = [threading.Thread(target=guarded, args=(_score_child, client, exp_id, parent_id,
                                                      f"c{process}w{w}", counts[w]))
               for w in range(WRITERS_PER_PROCESS)]
    readers = [threading.Thread(target=guarded, args=(_ui_reader, client, exp_id, stop, counts[-1 - r]))
               for r in range(READERS_PER_PROCESS)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    print(json.dumps({k: sum((c[k] for c in counts), [] if k == "failures" else 0)
                      for k in ("writes", "reads", "failures")}), flush=True)


def hammer(uri: str, study: str) -> dict:
    """PROCESSES client processes against `uri` at once; returns their summed operations and
    failures, and the seconds it took."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(study)
    parent = client.create_run(exp_id, run_name="score", tags={"gradshare.step": "score-launcher"})
    # No client-side retries: a 'database is locked' or any 5xx must surface, not be retried away.
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_TRACKING_URI": uri,
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    code = ("import sys; from tests.e2e.test_store_load import client_process; "
            "client_process(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, exp_id, parent.info.run_id, str(p)], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in range(PROCESSES)]
    total = {"writes": 0, "reads": 0, "failures": []}
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"a client process exited {p.returncode}: {err[-3000:]}"
        ops = json.loads(out.strip().splitlines()[-1])
        for k in ("writes", "reads", "failures"):
            total[k] += ops[k]
    total["seconds"] = time.perf_counter() - t0
    client.set_terminated(parent.info.run_id, "FINISHED")
    total["exp_id"], total["parent"] = exp_id, parent.info.run_id
    return total


def assert_everything_kept(uri: str, exp_id: str, parent: str) -> None:
    """Every run every child made is there, FINISHED, with exactly what was logged."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    children = client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000)
    assert len(children) == PROCESSES * WRITERS_PER_PROCESS * RUNS_EACH
    names = {(r.data.tags["load.client"], r.data.tags["load.index"]) for r in children}
    assert len(names) == len(children)  # no run twice, none lost
    for run in children:
        name, r = run.data.tags["load.client"], run.data.tags["load.index"]
        assert run.info.status == "FINISHED"
        assert run.data.params == {f"p{i}": f"{name}/{r}/{i}" for i in range(PARAMS)}
        assert {k: v for k, v in run.data.tags.items() if k.startswith("process.")} == \
            {f"process.t{i}": f"{name}-{i}" for i in range(TAGS)}
        assert len(run.data.metrics) == METRIC_KEYS + SINGLE_METRICS
        history = client.get_metric_history(run.info.run_id, f"score/m{METRIC_KEYS - 1}")
        assert sorted((m.step, m.value) for m in history) == \
            [(s, METRIC_KEYS - 1 + s / 100) for s in range(HISTORY_STEPS)]
        [artifact] = client.list_artifacts(run.info.run_id, "per_case")
        assert artifact.path == "per_case/test.jsonl" and artifact.file_size > 0


# ---- the tests -----------------------------------------------------------------------------

def test_sixteen_clients_at_once_on_the_shipped_sqlite_server_lose_nothing_and_never_lock(tmp_path):
    """12 score children and 4 UI readers, all at once, against `gradshare server`'s own command
    line (SQLite, the worker count it ships): every operation succeeds with client retries off,
    the server logs no 'database is locked' and answers every request 200, and every run, param,
    tag, metric step and artifact is in the store afterwards."""
    plan = load_plan("tiny", {"infra.artifact_destination": str(tmp_path / "artifacts")})
    # command()'s own worker count, as `gradshare server` passes it (1; MLflow's default is 4)
    cmd = command(plan, "127.0.0.1", free_port(), f"sqlite:///{tmp_path}/mlflow.db")
    t0 = time.perf_counter()
    proc, uri = _start(cmd, tmp_path)
    started = time.perf_counter() - t0
    try:
        result = hammer(uri, "load-study")
        log = (tmp_path / "server.log").read_text()
        print(f"[load] {PROCESSES * (WRITERS_PER_PROCESS + READERS_PER_PROCESS)} clients, "
              f"{result['writes']} writes, {result['reads']} reads, {len(result['failures'])} failures, "
              f"{result['seconds']:.1f} s (server {cmd[cmd.index('--workers') + 1]} worker(s), up in {started:.1f} s)")
        assert result["failures"] == []
        assert "database is locked" not in log
        statuses = re.findall(r'HTTP/1\.1" (\d{3})', log)  # uvicorn's access lines
        assert len(statuses) >= result["writes"] + result["reads"] and set(statuses) == {"200"}
        assert result["writes"] == PROCESSES * WRITERS_PER_PROCESS * RUNS_EACH * (5 + TAGS + SINGLE_METRICS)
        assert result["reads"] > 0
        t0 = time.perf_counter()
        assert_everything_kept(uri, result["exp_id"], result["parent"])
        print(f"[load] store checked in {time.perf_counter() - t0:.1f} s")
    finally:
        _stop(proc)


# ---- PostgreSQL ----------------------------------------------------------------------------

def _postgres_binaries() -> Path:
    """PostgreSQL's own binaries from the `pgserver` wheel (initdb, postgres), or a skip naming why."""
    pytest.importorskip("psycopg", reason="psycopg 3 (pip install 'psycopg[binary]') is SQLAlchemy 2.1's "
                                          "driver for MLflow's postgresql:// URIs; not installed")
    spec = importlib.util.find_spec("pgserver")
    if spec is None:
        pytest.skip("no PostgreSQL server here: pip install pgserver (PostgreSQL 16 in a wheel; it has wheels "
                    "for Python 3.11 and 3.12, none for 3.13 or later) to run this test")
    bindir = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
    if not (bindir / "postgres").exists():
        pytest.skip(f"pgserver is installed but carries no postgres binary at {bindir}")
    return bindir


class Postgres:
    """A real PostgreSQL server in a temporary directory on 127.0.0.1, for one test. PostgreSQL
    refuses to run as root; as root it runs as `nobody` from a copy of the binaries (the wheel's
    own lie under root's private home), in a directory `nobody` owns. Nothing outside that
    directory is changed (unlike pgserver's own API, which adds a system user as root)."""

    def __init__(self, bindir: Path):
        self.base, self.proc, self.as_user = Path(tempfile.mkdtemp(prefix="gradshare-pg-")), None, {}
        try:
            self._start(bindir)
        except BaseException:
            self.stop()
            raise

    def _start(self, bindir: Path) -> None:
        if os.geteuid() == 0:
            import pwd
            nobody = pwd.getpwnam("nobody")
            # the layout the wheel's RPATH expects: pgserver/pginstall/bin -> ../../../pgserver.libs
            wheel = bindir.parents[2]
            shutil.copytree(bindir.parent, self.base / "pgserver" / "pginstall", symlinks=True)
            if (wheel / "pgserver.libs").is_dir():
                shutil.copytree(wheel / "pgserver.libs", self.base / "pgserver.libs", symlinks=True)
            bindir = self.base / "pgserver" / "pginstall" / "bin"
            os.chmod(self.base, 0o755)
            (self.base / "data").mkdir(mode=0o700)
            os.chown(self.base / "data", nobody.pw_uid, nobody.pw_gid)
            self.as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        self.port, data = free_port(), self.base / "data"
        subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "--encoding=UTF8", "--no-locale"], check=True, capture_output=True, cwd=self.base,
                       **self.as_user)
        # -k '': no Unix socket (nothing to create outside data/); TCP on loopback only
        with open(self.base / "postgres.log", "w") as log:
            self.proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                                          "-p", str(self.port), "-k", ""], stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.base, **self.as_user)
        import psycopg
        deadline = time.time() + 60
        while True:
            try:
                conn = psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                       autocommit=True)
                break
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: "
                                       f"{(self.base / 'postgres.log').read_text()[-2000:]}") from None
                time.sleep(0.3)
        with conn:
            conn.execute("CREATE DATABASE mlflow")
        self.uri = f"postgresql://postgres@127.0.0.1:{self.port}/mlflow"

    def stop(self) -> None:
        import signal
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def test_a_small_study_prepares_and_trains_against_a_real_postgresql_store(tmp_path):
    """`gradshare server` with `--backend-store-uri postgresql://...` (a real PostgreSQL 16 from
    the pgserver wheel): prepare and the single arm run through the real entry points against
    it; the arm's run is FINISHED with its checkpoint hash, and its prepare run with it."""
    from mlflow import MlflowClient

    pg = Postgres(_postgres_binaries())
    try:
        plan = load_plan("tiny", {"infra.artifact_destination": str(tmp_path / "artifacts")})
        server, uri = _start(command(plan, "127.0.0.1", free_port(), pg.uri), tmp_path)
        try:
            study, env = "postgres-study", {"MLFLOW_TRACKING_URI": uri}  # os.environ stays as it was
            run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "2"}), env=env)
            run_entry("train", "--study", study, "--arm", "single", env=env)
            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name(study)
            [prep] = client.search_runs([exp.experiment_id], f"tags.`{STEP}` = 'prepare'")
            [train] = client.search_runs([exp.experiment_id], f"tags.`{STEP}` = 'train' and "
                                                             f"tags.`{ARM}` = 'single'")
            assert prep.info.status == "FINISHED" and train.info.status == "FINISHED"
            assert len(train.data.tags[CKPT_SHA]) == 64
            assert sorted(m.step for m in client.get_metric_history(train.info.run_id, "train/loss")) == \
                list(range(1, 9))
            # the store really is PostgreSQL: the run is a row there, not in some SQLite file
            import psycopg
            with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="mlflow") as conn:
                row = conn.execute("SELECT status FROM runs WHERE run_uuid = %s", (train.info.run_id,)).fetchone()
            assert row == ("FINISHED",)
            assert not list(tmp_path.glob("*.db"))
        finally:
            _stop(server)
    finally:
        pg.stop()
