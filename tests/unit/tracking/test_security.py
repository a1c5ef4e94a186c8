"""A safe tracking server and no leaked secret: an unreachable server is refused naming its
URI; `gradshare server` binds 127.0.0.1 unless told, and with `--auth` MLflow's basic-auth
app refuses an unauthenticated request and serves an authenticated one; the MLflow floor
excludes the releases with known server advisories. (No planted secret in the store of a
scored study: tests/e2e/test_secrets.py.)"""
from __future__ import annotations

import base64
import os
import re
import stat
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from gradshare.contract.plan import load_plan
from gradshare.tracking.server import NO_JOBS, command
from tests.conftest import REPO, free_port, run_entry, wait_until_serving


def test_an_unreachable_tracking_server_is_refused_naming_it(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_entry("prepare", "--study", "nowhere", env={"MLFLOW_TRACKING_URI": uri}, check=False)
    assert proc.returncode != 0
    [line] = [l for l in proc.stderr.splitlines() if "unreachable" in l]
    assert line.startswith(f"[gradshare] the tracking server {uri} is unreachable")
    assert "Traceback" not in proc.stderr


def test_the_server_binds_loopback_unless_told():
    plan = load_plan("tiny", {})
    cmd = command(plan, "127.0.0.1", 5000, "sqlite:///mlflow.db")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--app-name" not in cmd
    out = subprocess.run([sys.executable, "-m", "entrypoints.cli", "server", "--print"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "--host 127.0.0.1 " in out.stdout


def _get(url: str, auth: tuple[str, str] | None = None) -> int:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_basic_auth_refuses_the_unauthenticated_and_serves_the_authenticated(tmp_path):
    user, password = "gradshare-admin", "planted-admin-password-0001"
    port = free_port()
    env = {**os.environ, "GRADSHARE_SERVER_USER": user, "GRADSHARE_SERVER_PASSWORD": password}
    for key in NO_JOBS:  # gradshare server's own default, not the tests'
        env.pop(key)
    proc = subprocess.Popen([sys.executable, "-m", "entrypoints.cli", "server", "--auth", "--port", str(port),
                             "--auth-dir", str(tmp_path / "auth"), "--backend-store-uri",
                             f"sqlite:///{tmp_path}/mlflow.db", "--infra.artifact_destination",
                             str(tmp_path / "artifacts")], cwd=REPO, env=env,
                            stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, tmp_path / "server.log")
        api = url + "/api/2.0/mlflow/experiments/search?max_results=1"
        assert _get(api) == 401
        assert _get(api, (user, "wrong-password-000000")) == 401
        assert _get(api, (user, password)) == 200
        # a step with a wrong password: one line naming the server and the user, never the password,
        # no traceback (MLflow's client once ended in a 29-line one, with a 401)
        wrong = "wrong-password-000000"
        step = run_entry("prepare", "--study", "auth-refused", check=False,
                         env={"MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": user,
                              "MLFLOW_TRACKING_PASSWORD": wrong})
        assert step.returncode != 0 and "Traceback" not in step.stderr, step.stderr[-2000:]
        [line] = [x for x in step.stderr.splitlines() if x.strip()]
        assert line == (f"[gradshare] the tracking server {url} refused the credentials of user {user!r} (HTTP 401): "
                        f"set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an account it knows; "
                        f"nothing was done"), line
        assert wrong not in step.stderr + step.stdout
        assert _get(api, (user, password)) == 200  # and nothing was created: the study is not there
        found = urllib.request.Request(url + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=auth-refused")
        found.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            urllib.request.urlopen(found, timeout=10)
            raise AssertionError("the refused step created its study")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        # the password reached neither a command line nor the log; its config file is private
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        assert password not in cmdline and password not in (tmp_path / "server.log").read_text()
        ini = tmp_path / "auth" / "basic_auth.ini"
        assert stat.S_IMODE(ini.stat().st_mode) == 0o600
        # and no job runner beside it: the uvicorn worker is its only Python child
        children = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
        assert children and not [c for c in children if "huey" in c or "_job_runner" in c], children
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_auth_without_credentials_in_the_environment_is_refused():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSHARE_SERVER_")}
    out = subprocess.run([sys.executable, "-m", "entrypoints.cli", "server", "--auth", "--print"], cwd=REPO,
                         env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "set GRADSHARE_SERVER_USER and GRADSHARE_SERVER_PASSWORD" in out.stderr


def test_the_mlflow_floor_excludes_releases_with_server_advisories():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [spec] = [d for d in deps if d.startswith("mlflow")]
    floor = re.search(r">=\s*([\d.]+)", spec).group(1)
    assert tuple(int(x) for x in floor.split(".")) >= (3, 11)  # 3.10.0 and 3.11.0 fixed advisories
    from importlib.metadata import version

    installed = tuple(int(x) for x in version("mlflow").split(".")[:2])
    assert installed >= (3, 11)
