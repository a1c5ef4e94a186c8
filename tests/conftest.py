"""Shared fixtures: a real `mlflow server` on 127.0.0.1 (SQLite backend, served
artifacts), and small studies run through the real entry points.

The small plan keeps the study's shape (families, arms, warm-up, rank 32, global
normalisation) but shrinks the counts so that the suite runs on 2 CPU cores.

The tests live in two trees: tests/unit/<package>/ mirrors the code (gradshare's packages,
analysis, entrypoints, scripts, docs) and runs in a few minutes; tests/e2e/ holds every test
that goes through `mlflow run`, a whole study (prepare, train, commit, score, analyze), a
trained arm, a benchmark's harness or a fresh venv. Everything under tests/e2e carries the
`e2e` marker (set below, whatever the file says), so `pytest -m "not e2e"` is the quick tier.

Two pytest-xdist workers run the suite (`-n 2 --dist loadgroup --no-loadscope-reorder`, the
default in pyproject.toml; `SHARED_GROUPS` says how it is cut); each is a session of its own,
with its own server and its own copy of any session fixture its tests ask for. `-n 0`: one
process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from gradshare.contract.plan import PROFILES, load_plan
from gradshare.tracking.server import NO_JOBS
from gradshare.train.launch import free_port
from gradshare.contract.tags import STEP
from gradshare.tracking import connection
from gradshare.tracking import study_runs

REPO = Path(__file__).resolve().parents[1]
# Every `mlflow server` the tests start runs as `gradshare server` does: without MLflow's job
# runner (eight Python processes per server that the study never uses).
os.environ.update(NO_JOBS)
# Secrets planted in the environment of every step the suite runs: `planted_secrets_found` searches
# each worker's whole store for them once a whole study is in it (e2e/test_secrets.py,
# e2e/test_newcomer.py): they must reach no parameter, tag, artifact or metric.
PLANTED_SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDSECRET0001", "AWS_SECRET_ACCESS_KEY": "planted/aws+secret/key/0001",
    "GITHUB_TOKEN": "ghp_plantedtoken000000000000000000000001", "HF_TOKEN": "hf_plantedtoken0000000001",
    "DATABASE_PASSWORD": "planted-db-password-0001"}
os.environ.update(PLANTED_SECRETS)


def planted_secrets_found(server) -> list[str]:
    """Every planted secret found in the server's keeping (its database, with every parameter,
    tag and system metric, and every artifact), as "NAME in PATH"."""
    for name, secret in PLANTED_SECRETS.items():
        assert os.environ[name] == secret  # planted: the steps inherited it
    root = Path(server.artifacts).parent
    stores = [root / "mlflow.db", *[p for p in Path(server.artifacts).rglob("*") if p.is_file()]]
    assert len(stores) > 10  # the database and the studies' artifacts (inputs, checkpoints, ...)
    found = []
    for path in stores:
        data = path.read_bytes()
        found += [f"{name} in {path}" for name, secret in PLANTED_SECRETS.items() if secret.encode() in data]
    return found


# The `smoke` profile's counts (gradshare.contract.plan.PROFILES): the suite's small studies are that profile,
# as overrides, so that a test may change any of them.
SMALL = {k: v for k, v in PROFILES["smoke"].items() if k != "study.profile"}


E2E = Path(__file__).resolve().parent / "e2e"


SHARED_GROUPS = {
    # the modules that read the trained small study (`trained_study` and what follows it, and
    # `partial_study`): one worker builds it once
    "trained-small-study": ("e2e/test_train.py", "e2e/test_threads_study.py", "e2e/test_resume.py",
                            "e2e/test_limits.py", "e2e/test_commit_score.py", "e2e/test_analysis.py",
                            "e2e/test_secrets.py"),
    # the modules that make or count network namespaces (`netns.leftovers` sees every maker's),
    # and the first command's study across two emulated hosts
    "emulated-hosts": ("unit/hosts/test_two_hosts.py", "unit/hosts/test_metering.py", "e2e/test_preflight.py",
                       "e2e/test_two_hosts_study.py", "e2e/test_newcomer.py"),
}
"""On two workers (pytest-xdist, `--dist loadgroup`; see pyproject.toml) every module is one
unit of work, so that its module-scoped fixtures are made once; the modules named
here share one, because they share a session fixture too costly to make twice or a machine-wide
resource."""
_GROUP_OF = {module: group for group, modules in SHARED_GROUPS.items() for module in modules}


def _group(item) -> str:
    module = item.path.relative_to(REPO / "tests").as_posix()
    return _GROUP_OF.get(module, module)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e is e2e, though its module forgot `pytestmark`. Each test gets
    its unit of work for the workers (`SHARED_GROUPS`); on a worker, the e2e units come first and
    the shared ones before them: a worker takes the next unit when it is free, so the longest
    start first and the quick ones fill in at the end."""
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: k for k, name in enumerate(SHARED_GROUPS)}
        # sorted() is stable: within a unit, and among the units of one tier, the order collected
        items[:] = sorted(items, key=lambda it: (rank.get(_group(it), len(rank)),
                                                 E2E not in it.path.parents))


def wait_until_serving(proc: subprocess.Popen, uri: str, log: Path, timeout_s: float = 120) -> None:
    """Until the server at `uri` answers /health (any HTTP answer: an auth app may refuse it);
    the log's tail in the error if it dies or never answers."""
    deadline = time.time() + timeout_s
    while True:
        try:
            urllib.request.urlopen(uri + "/health", timeout=2).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the server at {uri} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)


class MlflowServer:
    """A real `mlflow server` (SQLite backend, served artifacts) that a test may stop and start
    again on the same port and store, as a crashed or restarted server would be."""

    def __init__(self, root: Path, port: int | None = None):
        self.root, self.port = root, port or free_port()
        self.uri, self.artifacts, self.proc = f"http://127.0.0.1:{self.port}", root / "artifacts", None

    def start(self) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db", "--artifacts-destination",
             str(self.artifacts), "--workers", "1"], stdout=open(log, "a"), stderr=subprocess.STDOUT,
            cwd=self.root, start_new_session=True)
        wait_until_serving(self.proc, self.uri, log)
        return self

    def freeze(self, frozen: bool = True) -> None:
        """SIGSTOP every process of the server (it accepts connections and never answers: a hung
        server, or a network that drops its packets); SIGCONT again with `frozen=False`."""
        import signal

        import psutil

        root = psutil.Process(self.proc.pid)
        for p in [root] + root.children(recursive=True):
            p.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def stop(self) -> None:
        """Every process of the server at once (SIGKILL): a crash, not a shutdown."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid)] + psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)


@pytest.fixture(scope="session", autouse=True)
def store_outside_the_checkout(tmp_path_factory):
    """A throwaway SQLite store for the tests that reach the tracking store without asking for a
    server (`analysis.verdicts` looks up the prepare run): never ./mlflow.db in the checkout,
    whichever test runs first. `mlflow_server` replaces it while it serves."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        yield
        return
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path_factory.mktemp('default-store')}/mlflow.db"
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session", autouse=True)
def kept_results_of_this_run(tmp_path_factory):
    """The kept results (`gradshare.util.kept`: the full profile's workload and shapes) of every
    step the suite runs go to one folder of this run, shared by its workers, never the user's
    ~/.cache: a run computes each once, and no earlier run's file is read."""
    from gradshare.util import kept

    if os.environ.get(kept.ENV):
        yield
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    os.environ[kept.ENV] = str((base.parent if worker else base) / "kept-results")
    yield
    os.environ.pop(kept.ENV, None)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real tracking server over HTTP; yields its URI and where it keeps artifacts."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = server.uri
    import mlflow
    mlflow.set_tracking_uri(server.uri)
    yield SimpleNamespace(uri=server.uri, artifacts=server.artifacts)
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old
    server.proc.terminate()
    server.proc.wait(timeout=30)


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
    # the study's experiment comes from --experiment-name alone, whatever a test left in os.environ
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    proc = subprocess.run(cmd, cwd=REPO, env={**env, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"mlflow run -e {entry} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-5000:]}")
    return proc


def mlflow_run_as_typed(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mlflow run . ARGS` exactly as typed in the repository, with no conda anywhere and no
    experiment named by the environment."""
    clean = {k: v for k, v in os.environ.items() if k not in ("CONDA_EXE", "MLFLOW_CONDA_HOME",
                                                                "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")}
    return subprocess.run([sys.executable, "-m", "mlflow", "run", ".", *args], cwd=REPO,
                          env={**clean, "PYTHONUNBUFFERED": "1", **(env or {})},
                          capture_output=True, text=True, timeout=900)


def load_script(name: str):
    """`scripts/<name>.py` as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_runs() -> list:
    """Every run of every (active) experiment in the store."""
    c = connection.client()
    exps = [e.experiment_id for e in c.search_experiments()]
    return c.search_runs(exps, max_results=5000) if exps else []


def experiment_id(name: str) -> str:
    """The experiment's id, made if needed (not `mlflow.set_experiment`, which would also set
    MLFLOW_EXPERIMENT_ID in this process's environment for every command a later test starts)."""
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    return exp.experiment_id if exp else connection.client().create_experiment(name)


def runs(study: str, step: str, arm: str | None = None):
    return study_runs.search(study, step, arm)


SMALL_ARMS = {"arms.rows": "single:single:1,dense:dense:2,powersgd:powersgd:2,powersgd8:powersgd:2:rank=8,"
                          "fp16:fp16:2"}
"""The small study's arms: the study's three; PowerSGD at rank 8, a fourth arm as a researcher
would add it (one row); and `fp16`, a fifth of a kind added as one module (`gradshare.kinds.fp16`)
and one line of the kinds' table. Each is trained, committed, scored and analyzed like the others."""
SMALL_STUDY = SMALL | SMALL_ARMS


@pytest.fixture(scope="session")
def prepared_study(mlflow_server):
    """A small study of five arms (`SMALL_ARMS`) prepared through `mlflow run . -e prepare` (the
    MLproject path)."""
    study = "small-study"
    mlflow_run("prepare", study, SMALL_STUDY)
    return study


@pytest.fixture(scope="session")
def trained_study(prepared_study):
    """The small study with its five arms trained, one after another, as its plan lists them."""
    for arm in load_plan("tiny", SMALL_STUDY).arms.names:
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
    return bool(study_runs.finished_score_steps(study))


def commitment_of(study: str) -> dict:
    import json
    [run] = study_runs.search(study, "commit", status="FINISHED")
    return json.loads(study_runs.read_text(run.info.run_id, "commitment.json"))


@pytest.fixture(scope="session")
def committed_study(trained_study):
    """The small study, committed once (whichever test asks first)."""
    if not study_runs.is_committed(trained_study):
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


@pytest.fixture(scope="session")
def first_command_study(mlflow_server):
    """The README's first command (`mlflow run . -e study -P new_study=true`, no experiment
    name) on the `smoke` profile, the whole study: its two-process arms cross two emulated hosts where this machine
    can make them (root), else loopback. Its runs are kept as they ended (e2e/test_newcomer later
    archives the study by preparing a new one of the same name; run ids stay valid).

    The emulated link runs at 200 Mbit/s, not the plan's 22: no test here reads its speed (the
    plan's rate is measured in unit/hosts/test_two_hosts), and dense's 8 exchanges take 17 s less."""
    from gradshare.tracking import orphans
    study = "whole-study"
    args = ["-e", "study", "--env-manager", "local", "-P", "new_study=true", "-P", f"study={study}",
            "-P", "profile=smoke"]
    for k, v in {"model.pretrain_steps": "2", "link.rate_mbit": "200"}.items():
        args += ["-P", f"{k}={v}"]
    default_before = len(connection.client().search_runs(["0"]))
    # No grace: a step that mistook the live launcher (or a sibling) for an orphan shows at once.
    proc = mlflow_run_as_typed(*args, env={orphans.GRACE_ENV: "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = connection.client().get_experiment_by_name(study)
    runs = connection.client().search_runs([exp.experiment_id], max_results=1000)
    return SimpleNamespace(study=study, proc=proc, runs=runs, default_before=default_before,
                           by_step=lambda step: [r for r in runs if r.data.tags.get(STEP) == step])
