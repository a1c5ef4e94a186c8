"""Entry point `analyze`: verdicts, report and plots, read only through the tracking API.

    mlflow run . -e analyze --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny

Logs verdicts.json, report.md, report.html and the plots to an analyze run and
prints the verdict table.
"""
from __future__ import annotations

import argparse

from entrypoints.common import parse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="gradshare-tiny")
    args, overrides = parse(ap, argv)
    if overrides:
        ap.error("analyze takes its plan from the prepare run; it takes no overrides")

    from analysis.analyze import run
    from gradshare import tracking as T

    with T.study_run(args.study, "analyze", run_name="analyze"):
        run(args.study)


if __name__ == "__main__":
    main()
