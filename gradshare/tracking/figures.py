"""A study's measured figures, read from the tracking store in this one place, as plain values that
`gradshare.cost` computes with (cost reads no store itself):

    prep, plan = store.prepared_plan(study)
    known = figures.read(study, prep, plan)          # what the limits and the go/no-go need
    limits.arm_limits(plan, arm, known)              # ... arithmetic only
    arms = figures.link_arms(study, plan)            # the histories a study's machine is fitted on
    workload = figures.study_workload(prep, plan)    # prepare's record of the schedule's work

Each quantity has one reader: the FINISHED train runs and their `perf/step_s` (`finished_runs`),
the train attempts that held hosts (`attempts`), the latest finished preflight's `preflight.json`
(`preflight`), and the prepare run's start, model shapes and workload.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from gradshare.contract import metrics as M
from gradshare.contract.tags import ATTEMPT, REFUSAL
from gradshare.inputs.workload import WORKLOAD
from gradshare.model.source import MODEL_SHAPES, parameter_shapes
from gradshare.tracking import connection, study_runs

START_PARAM = "study_start_epoch_s"  # prepare's parameter: when the study's clock started
PREFLIGHT_FILE = "preflight.json"  # the preflight run's figures (`gradshare.steps.preflight` writes it)


@dataclass(frozen=True)
class FinishedRun:
    """One FINISHED train run of an arm, as the projections read it."""
    run_id: str
    arm: str
    metrics: dict[str, float]
    """Its summary metrics (each one's last value): wall, active and phase seconds."""
    params: dict[str, str]
    step_s: tuple[tuple[int, float], ...]
    """`perf/step_s`: (update, seconds) of every update, as logged."""

    @property
    def median_step_s(self) -> float | None:
        """The median of its updates' seconds (None where it logged none): the arm's measured rate."""
        return statistics.median(s for _, s in self.step_s) if self.step_s else None


@dataclass(frozen=True)
class StudyFigures:
    """What the deadline and budget checks and the preflight's go/no-go know of a study."""
    start_epoch: float
    """When the study's clock started (prepare's `study_start_epoch_s`)."""
    finished: dict[str, tuple[FinishedRun, ...]]
    """Every arm of the plan: its FINISHED train runs, oldest first (none: not done)."""
    attempts: tuple
    """The train runs that held hosts (every attempt, any status; not refusals), as the store
    returned them: their arm tag, start and end times and metrics price them (`limits.run_spend`)."""
    shapes: tuple[tuple[int, ...], ...]
    """The model's trainable parameter shapes (`prepared_shapes`)."""
    preflight: dict | None
    """The latest finished preflight's figures (`preflight`), or None where none ran."""

    @property
    def done(self) -> set[str]:
        """The arms with a FINISHED run."""
        return {arm for arm, runs in self.finished.items() if runs}


def study_start(prep) -> float:
    """When the study started: prepare's recorded start, or its run's start for older studies."""
    value = prep.data.params.get(START_PARAM)
    return float(value) if value else prep.info.start_time / 1000


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in connection.client().get_metric_history(run_id, key)]


def finished_runs(study: str, plan) -> dict[str, tuple[FinishedRun, ...]]:
    """Every arm of the plan: its FINISHED train runs, oldest first, each with its `perf/step_s`."""
    return {arm: tuple(FinishedRun(run.info.run_id, arm, dict(run.data.metrics), dict(run.data.params),
                                   tuple(_history(run.info.run_id, M.STEP_S)))
                       for run in study_runs.search(study, "train", arm, status="FINISHED"))
            for arm in plan.arms.names}


def attempts(study: str) -> tuple:
    """The study's train runs that held hosts: a refusal never did, nor a record without an attempt
    (an unavailable arm's, or a launcher that never started workers)."""
    return tuple(run for run in study_runs.search(study, "train")
                 if run.data.tags.get(REFUSAL) != "true" and ATTEMPT in run.data.tags)


def preflight(study: str) -> dict | None:
    """The study's latest finished preflight's figures (with its `run_id`), or None."""
    runs = study_runs.search(study, "preflight", status="FINISHED")
    if not runs:
        return None
    found = json.loads(study_runs.read_text(runs[0].info.run_id, PREFLIGHT_FILE))
    found["run_id"] = runs[0].info.run_id
    return found


def prepared_shapes(prep, plan) -> list[tuple[int, ...]]:
    """The model's trainable parameter shapes as prepare recorded them (`model_shapes.json`); a
    study prepared before they were recorded has them built on the meta device (about 5 s)."""
    from mlflow.exceptions import MlflowException  # heavy: imported where a store is read

    try:
        recorded = json.loads(study_runs.read_text(prep.info.run_id, MODEL_SHAPES))
    except (MlflowException, OSError):
        return parameter_shapes(plan)
    return [tuple(s) for s in recorded["shapes"]]


def study_workload(prep, plan) -> dict | None:
    """The workload prepare recorded for a full-profile study; None for another profile (its
    schedule is not the study's hosts') and for a study prepared before it was recorded."""
    if prep is None or plan.study.profile != "full":
        return None
    from mlflow.exceptions import MlflowException  # heavy: imported where a store is read

    try:
        return json.loads(study_runs.read_text(prep.info.run_id, f"inputs/{WORKLOAD}"))
    except (MlflowException, OSError):
        return None


def read(study: str, prep, plan, shapes: list[tuple[int, ...]] | None = None) -> StudyFigures:
    """Everything the limits and the go/no-go read of `study`; `shapes` where the caller read them
    already (the preflight, before it measured with them)."""
    return StudyFigures(start_epoch=study_start(prep), finished=finished_runs(study, plan), attempts=attempts(study),
                        shapes=tuple(prepared_shapes(prep, plan) if shapes is None else shapes),
                        preflight=preflight(study))


def link_arms(study: str, plan) -> dict[str, dict]:
    """The histories `cost.link.from_measurements` fits a study's machine on: each arm's newest
    FINISHED run's seconds, tokens per second and logical bytes per update, and its link rate."""
    arms = {}
    for arm, runs in finished_runs(study, plan).items():
        if not runs:
            continue
        run = runs[-1]
        arms[arm] = {"step_s": list(run.step_s), "tokens_per_s": _history(run.run_id, M.TOKENS_PER_S),
                     "logical_bytes": _history(run.run_id, M.LOGICAL_BYTES),
                     "link_rate_mbit": run.params.get("link_rate_mbit")}
    return arms
