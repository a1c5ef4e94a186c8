"""`gradshare server`: the MLflow tracking server a study logs to, its artifacts where the plan
says (`infra.artifact_destination`), bound to 127.0.0.1 unless told.

    gradshare server                                     # 127.0.0.1:5000, sqlite:///mlflow.db, ./mlartifacts
    gradshare server --profile full --host 10.0.0.5     # the main host's address, for the second host
    gradshare server --infra.artifact_destination=s3://bucket/prefix   # plan fields, either form
    GRADSHARE_SERVER_USER=admin GRADSHARE_SERVER_PASSWORD=... gradshare server --auth

What it runs, S3, and where the basic-auth app keeps its credentials: `gradshare.tracking.server`.
"""
from __future__ import annotations

import argparse
import os
import secrets

from entrypoints.common import plan_overrides
from gradshare.contract.plan import PlanError, load_plan
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
    args, rest = ap.parse_known_args(argv)
    try:
        plan = load_plan(args.profile, plan_overrides(ap, rest))
    except PlanError as exc:
        ap.error(" ".join(str(exc).split()))
    cmd = command(plan, args.host, args.port, args.backend_store_uri,
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
