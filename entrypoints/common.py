"""Argument parsing shared by the entry points: known flags plus `--concern.field value` plan overrides.

MLflow appends parameters an entry point does not declare as `--name value`, so any
plan field can be overridden with `-P concern.field=value`.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gradshare.contract.errors import StudyError
from gradshare.contract.tags import FAILURE, REFUSAL, RUN_NAME
from gradshare.tracking import connection
from gradshare.tracking.connection import check_study_name
from gradshare.util.scratch import use_scratch


class StepParser(argparse.ArgumentParser):
    """argparse that, before it exits on a bad parameter, records why on the run a launcher
    (`mlflow run`) already made for this step: a refusal, ended KILLED with the reason and the
    allowed values, instead of a bare FAILED run (the launcher keeps KILLED where its process
    has `tracking.mlflow_run_keeps_the_steps_end`)."""

    def error(self, message):
        self.record_refusal(f"bad parameter: {message}")
        super().error(message)

    def record_refusal(self, reason: str) -> None:
        """The launcher's run, if `mlflow run` made one, ended KILLED as a refusal with `reason`."""
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if run_id:
            try:
                tags = {FAILURE: reason, REFUSAL: "true", RUN_NAME: f"refused-{Path(self.prog).stem}"}
                for key, value in tags.items():
                    connection.client().set_tag(run_id, key, value)
                connection.client().set_terminated(run_id, "KILLED")
            except Exception as exc:  # the refusal itself is what the user must see
                print(f"[gradshare] could not record the refusal on run {run_id}: {exc}", file=sys.stderr)


def study_parser(doc: str, makes_plan: bool = False) -> argparse.ArgumentParser:
    """A parser whose help is the entry point's docstring, with the `--study` every step takes;
    steps that make the plan (prepare, study) also take the profile and `--new-study`."""
    ap = StepParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="gradshare-tiny")
    if makes_plan:
        ap.add_argument("--profile", default="tiny")
        ap.add_argument("--new-study", "--new_study", default="false")
    return ap


def parse(parser: argparse.ArgumentParser, argv=None, overrides_allowed: bool = True
          ) -> tuple[argparse.Namespace, dict[str, str]]:
    """Known flags, and the rest as plan overrides (refused where the plan is already fixed)."""
    args, rest = parser.parse_known_args(argv)

    try:
        use_scratch(Path(parser.prog).stem)  # the step's temporary files, removed when it ends
    except StudyError as exc:  # TMPDIR cannot be written: one line, before any work
        if isinstance(parser, StepParser):
            parser.record_refusal(str(exc))
        parser.exit(2, f"[gradshare] {exc}\n")
    if getattr(args, "study", None) is not None:
        try:
            check_study_name(args.study)
        except StudyError as exc:
            parser.error(str(exc))
    if rest and not overrides_allowed:
        parser.error(f"unexpected {' '.join(rest)}: this step takes its plan from the prepare run; "
                     "plan overrides belong to prepare")
    return args, plan_overrides(parser, rest)


def plan_overrides(parser: argparse.ArgumentParser, rest: list[str]) -> dict[str, str]:
    """`--concern.field VALUE` and `--concern.field=VALUE` alike, as {field: value}; anything
    else is the parser's error (the one parser of every command that takes plan fields)."""
    overrides: dict[str, str] = {}
    i = 0
    while i < len(rest):
        key = rest[i]
        if not key.startswith("--") or "." not in key.split("=", 1)[0]:
            parser.error(f"unexpected argument {key!r}: plan overrides look like --concern.field VALUE")
        if "=" in key:
            k, v = key[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(rest):
                parser.error(f"plan override {key} has no value")
            k, v = key[2:], rest[i + 1]
            i += 2
        overrides[k] = v
    return overrides


def truthy(value: str | bool) -> bool:
    return str(value).lower() in ("1", "true", "yes")
