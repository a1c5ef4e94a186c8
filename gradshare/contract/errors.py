"""The errors a user can act on: a plan that cannot run, a step's one-line reason, and a refusal
that costs nothing."""
from __future__ import annotations


class PlanError(ValueError):
    """A plan that cannot be run as written; the message names the fields."""


class StudyError(RuntimeError):
    """A failure a user can act on: the message says what was wrong and what to do."""


class Refusal(StudyError):
    """The step was refused before it did any work (already done, committed, not allowed):
    its run ends KILLED (a failure ends FAILED), tagged `gradshare.refusal=true` with the reason
    in `gradshare.failure_reason`, and is not an attempt of anything."""


class Interrupted(KeyboardInterrupt):
    """The step was stopped from outside (SIGTERM, as `kill`, a shutdown or `mlflow run` passing
    on its own stop do; Ctrl-C raises a plain KeyboardInterrupt): its run ends KILLED, tagged
    `gradshare.interrupted=true`, with the reason `interrupted: ...`. An interrupted train run
    stays in the ledger as what it was, but uses none of the arm's `arms.max_attempts`: a re-run
    of the study continues where it stopped."""
