"""`gradshare upload`: deliver what arms kept on local disk while the tracking server was gone.

    gradshare upload                          # every journal under ./gradshare-outbox
    gradshare upload gradshare-outbox/<run id> [--tracking-uri http://host:5000]

The journal, its order and its at-most-once delivery: `gradshare.tracking.outbox`.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import mlflow  # upload is the one command that exists to talk to the tracking server

from gradshare.tracking.connection import DEFAULT_URI, check_reachable
from gradshare.tracking.delivered import drop_delivered
from gradshare.tracking.outbox import ENV, root, upload


def main(argv=None) -> None:
    """`gradshare upload [DIR ...]`: deliver what arms kept while the tracking server was gone."""
    ap = argparse.ArgumentParser(prog="gradshare upload", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help=f"outbox or run directories (default: ${ENV} or ./gradshare-outbox)")
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    args = ap.parse_args(argv)

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    mlflow.set_tracking_uri(uri)
    check_reachable(uri)
    paths = [Path(p) for p in args.paths] or [root()]
    if not any(p.exists() for p in paths):
        raise SystemExit(f"[gradshare] upload: nothing at {', '.join(map(str, paths))}: no arm kept records here")
    waiting = upload(paths)
    drop_delivered(paths)  # an ended run the store now has whole: its copies and checkpoint are disk for nothing
    raise SystemExit(1 if waiting else 0)


if __name__ == "__main__":
    main()
