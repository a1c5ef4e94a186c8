"""`gradshare server`: the MLflow tracking server a study logs to, its artifacts where the plan
says (`infra.artifact_destination`, e.g. s3://bucket/prefix), bound to 127.0.0.1 unless told.

    gradshare server                                     # 127.0.0.1:5000, sqlite:///mlflow.db, ./mlartifacts
    gradshare server --profile full --host 10.0.0.5     # the main host's address, for the second host
    # artifacts in S3: the server alone needs AWS credentials (boto3's standard chain); the
    # hosts talk only HTTP to it (`mlflow-artifacts:` proxying)

    # with MLflow's basic-auth app: the admin's name and password from the environment
    GRADSHARE_SERVER_USER=admin GRADSHARE_SERVER_PASSWORD=... gradshare server --auth
    # clients then authenticate with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD

It runs `mlflow server` in the foreground (Ctrl-C stops it). The credentials never reach a
command line or a log: they go into the auth app's config file, private to this user
(mode 0600), in a directory of its own.
"""
from __future__ import annotations

import os
import stat
import sys

USER_ENV, PASSWORD_ENV = "GRADSHARE_SERVER_USER", "GRADSHARE_SERVER_PASSWORD"
# MLflow (3.x) starts a job runner and seven huey consumers beside every server with a database
# store, for GenAI jobs a study never submits: eight Python processes, about 30 CPU-seconds to
# start and 1.9 GB resident (measured on the 2-core machine). Off unless the caller says otherwise.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def command(plan, host: str, port: int, backend: str, workers: int = 1, auth: bool = False) -> list[str]:
    dest = plan.infra.artifact_destination or os.path.abspath("mlartifacts")
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
           "--backend-store-uri", backend, "--artifacts-destination", dest, "--workers", str(workers)]
    return cmd + (["--app-name", "basic-auth"] if auth else [])


def auth_config(directory: str, env=None) -> str:
    """Write MLflow's basic-auth config with the admin from the environment; returns its path."""

    env = os.environ if env is None else env
    user, password = env.get(USER_ENV), env.get(PASSWORD_ENV)
    if not user or not password:
        raise SystemExit(f"gradshare server --auth: set {USER_ENV} and {PASSWORD_ENV} (the admin's name and "
                         f"password; they are written only to a private config file)")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "basic_auth.ini")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as fh:
        fh.write("[mlflow]\ndefault_permission = READ\n"
                 f"database_uri = sqlite:///{os.path.join(directory, 'basic_auth.db')}\n"
                 f"admin_username = {user}\nadmin_password = {password}\nauthorization_function = "
                 "mlflow.server.auth:authenticate_request_basic_auth\n")
    return path
