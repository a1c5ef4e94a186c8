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

import argparse
import os
import secrets

from gradshare.contract.plan import load_plan
from gradshare.tracking.server import (
    NO_JOBS,
    PASSWORD_ENV,
    USER_ENV,
    auth_config,
    command,
)


def _secret_key(directory: str) -> str:
    """The auth app's CSRF key: made once, kept private beside its config, the same across restarts."""

    path = os.path.join(directory, "flask_secret_key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    with open(path) as fh:
        return fh.read().strip()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="gradshare server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--backend-store-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--auth", action="store_true", help=f"MLflow's basic-auth app; admin from ${USER_ENV}, "
                                                        f"${PASSWORD_ENV}")
    ap.add_argument("--auth-dir", default=".gradshare-auth", help="where the auth app keeps its config and users")
    ap.add_argument("--print", action="store_true", help="print the command instead of running it")
    args, overrides = ap.parse_known_args(argv)
    plan_overrides = dict(zip([k[2:] for k in overrides[::2]], overrides[1::2]))
    cmd = command(load_plan(args.profile, plan_overrides), args.host, args.port, args.backend_store_uri,
                  auth=args.auth)
    if args.auth:
        os.environ["MLFLOW_AUTH_CONFIG_PATH"] = auth_config(os.path.abspath(args.auth_dir))
        os.environ.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", _secret_key(os.path.abspath(args.auth_dir)))
    for key, value in NO_JOBS.items():
        os.environ.setdefault(key, value)
    print(" ".join(cmd), flush=True)
    if not args.print:
        os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
