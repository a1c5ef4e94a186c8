"""`train`: one arm of the study in its run, as the `train` entry point starts it (the arm's
processes, their watch and its result: `gradshare.train.driver`). Machine rank 0 owns the arm's
run; another host runs its workers under the launcher's run, which says what it is; a resume
is checked before anything is reopened, and refused on a run of its own.

    train_arm("gradshare-tiny", "dense", Launch(1, 0, "127.0.0.1", 0), full_state_every=0, resume_from=None)
"""
from __future__ import annotations

import logging
import os

from gradshare.contract import metrics as M
from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.tags import FAILURE, INTERRUPTED, REFUSAL, RESUMED_RUN, RUN_NAME, STEP, STUDY
from gradshare.tracking import clock, connection, study_runs
from gradshare.tracking.orphans import process_tags
from gradshare.train.driver import run_arm, run_secondary_host
from gradshare.train.launch import Launch
from gradshare.train.resume import check_resume


def train_arm(study: str, arm: str, launch: Launch, full_state_every: int, resume_from: str | None) -> None:
    """The arm on this host: its run and result on machine rank 0, its workers only elsewhere."""
    if launch.machine_rank > 0:  # only machine rank 0 owns the arm's MLflow run
        _secondary_host(study, arm, launch)
        return
    resume = None
    if resume_from:
        resume = _checked_resume(study, arm, resume_from)
        os.environ["MLFLOW_RUN_ID"] = resume_from  # the stopped run, reopened: one run per attempt
    import mlflow

    # MLflow's system metrics: a sample every 2 s, each logged as taken (its defaults, 10 s and
    # one sample, leave an arm shorter than 10 s without any)
    mlflow.set_system_metrics_sampling_interval(2)
    mlflow.set_system_metrics_samples_before_logging(1)
    # ... and without its INFO lines at each start and stop ("Skip logging GPU metrics", ...)
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    with study_runs.study_run(study, "train", arm=arm, run_name=f"train-{arm}", system_metrics=True) as run:
        summary = run_arm(study, arm, run, launch, full_state_every, resume)
        if summary:
            m = summary["metrics"]
            print(f"[gradshare] arm {arm} FINISHED: final loss {m[M.FINAL_LOSS]:.4f}, "
                  f"active {m[M.ACTIVE_S]:.1f}s, {m[M.ACTIVE_TOKENS_PER_S]:,.0f} tok/s, "
                  f"checkpoint {summary['checkpoint_sha256'][:16]}…")


def _secondary_host(study: str, arm: str, launch: Launch) -> None:
    """Machine rank > 0: this host's workers, no run of its own. The run `mlflow run` made for
    it says what it is (`train-<arm>-host<rank>`) and that its process lives; a clock behind the
    study's is refused on it, as on every step's run."""
    exp_id = study_runs.setup(study, create=False)
    launcher = os.environ.get("MLFLOW_RUN_ID")
    name = f"train-{arm}-host{launch.machine_rank}"
    if launcher:  # a launcher's run for this host: say what it is and that it lives
        tags = study_runs.study_tags(study, "train-host", "", arm) | process_tags() | {RUN_NAME: name}
        for key, value in tags.items():
            connection.client().set_tag(launcher, key, value)
    try:
        clock.check(exp_id, exclude={launcher} if launcher else set())
    except Refusal as exc:
        if launcher:  # KILLED and tagged, as every refused step's run
            c = connection.client()
            for key, value in {FAILURE: str(exc), REFUSAL: "true", RUN_NAME: f"refused-{name}"}.items():
                c.set_tag(launcher, key, value)
            c.set_terminated(launcher, "KILLED")
        raise SystemExit(f"[gradshare] train host {launch.machine_rank} refused: {exc}") from None
    try:
        run_secondary_host(study, arm, launch)
    except KeyboardInterrupt as exc:  # stopped from outside: this host's run says so, KILLED
        reason = f"host {launch.machine_rank}: interrupted: {' '.join(str(exc).split()) or 'stopped by the user'}"
        if launcher:
            try:
                c = connection.client()
                c.set_tag(launcher, FAILURE, reason)
                c.set_tag(launcher, INTERRUPTED, "true")
                connection.mlflow_run_keeps_the_steps_end()
                c.set_terminated(launcher, "KILLED")
            except Exception:  # noqa: BLE001 - the line below says it either way
                pass
        raise SystemExit(f"[gradshare] train host {launch.machine_rank} {reason}") from None
    except Refusal as exc:  # the machine's fault (a link too slow, a workdir changed): no attempt used
        if launcher:
            try:
                c = connection.client()
                for key, value in {FAILURE: f"host {launch.machine_rank}: {exc}", REFUSAL: "true",
                                   RUN_NAME: f"refused-{name}"}.items():
                    c.set_tag(launcher, key, value)
                connection.mlflow_run_keeps_the_steps_end()
                c.set_terminated(launcher, "KILLED")
            except Exception:  # noqa: BLE001 - the line below says it either way
                pass
        raise SystemExit(f"[gradshare] train host {launch.machine_rank} refused: {exc}") from None
    except StudyError as exc:
        if launcher:  # the reason on this host's run too: a FAILED run never stands without one
            try:
                connection.client().set_tag(launcher, FAILURE, f"host {launch.machine_rank}: {exc}")
            except Exception:  # noqa: BLE001 - the line below says it either way
                pass
        raise SystemExit(f"[gradshare] train host {launch.machine_rank} FAILED: {exc}") from None


def _checked_resume(study: str, arm: str, run_id: str):
    """The verified resume, or a refusal recorded on a run of its own (the launcher's, if
    `mlflow run` made one) while the stopped run stays untouched."""

    study_runs.setup(study, create=False)
    try:
        resume = check_resume(study, arm, run_id)
    except Refusal as exc:
        with study_runs.study_run(study, "train", arm=arm, run_name=f"train-{arm}"):
            raise exc
    launcher = os.environ.pop("MLFLOW_RUN_ID", None)
    if launcher and launcher != run_id:  # `mlflow run` made a run for this command: it only points
        c = connection.client()
        c.set_tag(launcher, STUDY, study)
        c.set_tag(launcher, STEP, "train-resume")
        c.set_tag(launcher, RUN_NAME, f"train-{arm}-resume")  # it only points at the run it resumed
        c.set_tag(launcher, RESUMED_RUN, run_id)
        c.set_terminated(launcher, "FINISHED")
    return resume
