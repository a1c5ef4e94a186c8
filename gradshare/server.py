"""`gradshare server`: the MLflow tracking server a study logs to, its artifacts where the plan
says (`infra.artifact_destination`, e.g. s3://bucket/prefix), bound to 127.0.0.1 unless told.

    gradshare server                                     # 127.0.0.1:5000, sqlite:///mlflow.db, ./mlartifacts
    gradshare server --profile full --host 10.0.0.5     # the main host's address, for the second host
    # artifacts in S3: the server alone needs AWS credentials (boto3's standard chain); the
    # hosts talk only HTTP to it (`mlflow-artifacts:` proxying)

It runs `mlflow server` in the foreground (Ctrl-C stops it).
"""
from __future__ import annotations

import argparse
import os
import sys


def command(plan, host: str, port: int, backend: str, workers: int = 1) -> list[str]:
    dest = plan.infra.artifact_destination or os.path.abspath("mlartifacts")
    return [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
            "--backend-store-uri", backend, "--artifacts-destination", dest, "--workers", str(workers)]


def main(argv=None) -> None:
    from gradshare.plan import load_plan

    ap = argparse.ArgumentParser(prog="gradshare server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--backend-store-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--print", action="store_true", help="print the command instead of running it")
    args, overrides = ap.parse_known_args(argv)
    plan_overrides = dict(zip([k[2:] for k in overrides[::2]], overrides[1::2]))
    cmd = command(load_plan(args.profile, plan_overrides), args.host, args.port, args.backend_store_uri)
    print(" ".join(cmd), flush=True)
    if not args.print:
        os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
