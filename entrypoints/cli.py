"""The `gradshare` command: each step of the study, as the MLproject entry points run it.

    gradshare prepare --study gradshare-tiny [--profile full] [--concern.field VALUE ...]
    gradshare train --study gradshare-tiny --arm dense
    gradshare commit|score|analyze --study gradshare-tiny
    gradshare study --study gradshare-tiny --new-study true
    gradshare preflight --study gradshare-full      # measure the hosts before any arm: go or no-go
    gradshare project [--study gradshare-tiny]      # speed and dollars on the study's hosts, 2-64 hosts
    gradshare guard --study gradshare-full          # stop the plan's EC2 instances at the deadline
    gradshare server [--profile full]               # the tracking server, artifacts where the plan says
    gradshare upload [gradshare-outbox/<run id>]    # what arms kept while the tracking server was gone
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = ("prepare", "train", "commit", "score", "analyze", "study", "project", "guard", "preflight",
            "server", "upload")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    # The command's module is imported only now (allow-listed in tests/unit/test_layers.py): each
    # loads what its step needs, torch among them for score, and `gradshare --help` loads none.
    importlib.import_module(f"entrypoints.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    main()
