"""Entry point `score`: the seed model and every committed arm, case by case.

    mlflow run . -e score --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny

Refuses unless the study is committed and every committed checkpoint still hashes
to its commitment. Logs one nested score run per model with per_case/test.jsonl
and per_case/retention.jsonl.
"""
from __future__ import annotations

from entrypoints.common import parse, study_parser
from gradshare.steps.score import score_study
from gradshare.tracking import study_runs


def main(argv=None) -> None:
    ap = study_parser(__doc__)
    args, _ = parse(ap, argv, overrides_allowed=False)

    with study_runs.study_run(args.study, "score", run_name="score") as run:
        score_study(args.study, run)


if __name__ == "__main__":
    main()
