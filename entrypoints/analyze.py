"""Entry point `analyze`: verdicts, report and plots, read only through the tracking API.

    mlflow run . -e analyze --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny

Logs verdicts.json, report.md, report.html and the plots to an analyze run and
prints the verdict table.
"""
from __future__ import annotations

from analysis.analyze import run
from entrypoints.common import parse, study_parser
from gradshare.tracking import study_runs


def main(argv=None) -> None:
    ap = study_parser(__doc__)
    args, _ = parse(ap, argv, overrides_allowed=False)

    with study_runs.study_run(args.study, "analyze", run_name="analyze"):
        run(args.study)


if __name__ == "__main__":
    main()
