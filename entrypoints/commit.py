"""Entry point `commit`: seal every arm's final model before any test scoring.

    mlflow run . -e commit --env-manager local --experiment-name gradshare-tiny -P study=gradshare-tiny

Writes `commitment.json` (arm, run id, status, checkpoint SHA-256 or failure reason,
time) and tags the study committed. Committing twice refuses.
"""
from __future__ import annotations

from entrypoints.common import parse, study_parser
from gradshare.steps.commit import commit_study
from gradshare.tracking import study_runs


def main(argv=None) -> None:
    ap = study_parser(__doc__)
    args, _ = parse(ap, argv, overrides_allowed=False)

    with study_runs.study_run(args.study, "commit", run_name="commit") as run:
        c = commit_study(args.study, run.info.run_id)
        for e in c["arms"]:
            what = e.get("checkpoint_sha256", "")[:16] + "…" if e["status"] == "FINISHED" else e["failure_reason"]
            print(f"[gradshare] committed {e['arm']:<9} {e['status']:<9} {what}")


if __name__ == "__main__":
    main()
