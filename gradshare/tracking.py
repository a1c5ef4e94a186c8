"""MLflow: where every step's run lives, how steps find each other, how failure shows.

Steps talk only through the tracking store: tags, run ids, artifacts. The store is
whatever `MLFLOW_TRACKING_URI` says, else `sqlite:///mlflow.db` in the working
directory. The experiment is the study's name.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

DEFAULT_URI = "sqlite:///mlflow.db"
T = "gradshare."  # tag namespace
STUDY, STEP, PLAN_SHA, ARM = T + "study", T + "step", T + "plan_sha256", T + "arm"
EXPERIMENT_KIND = "mlflow.experimentKind"
FAILURE, CKPT_SHA, COMMITTED = T + "failure_reason", T + "checkpoint_sha256", T + "committed"
REFUSAL, ATTEMPT, CLAIM = T + "refusal", T + "attempt", T + "claim"


class StudyError(RuntimeError):
    """A failure a user can act on: the message says what was wrong and what to do."""


class Refusal(StudyError):
    """The step was refused before it did any work (already done, committed, not allowed):
    its run ends KILLED (a failure ends FAILED), tagged `gradshare.refusal=true` with the reason
    in `gradshare.failure_reason`, and is not an attempt of anything."""


def mlflow_run_keeps_the_steps_end() -> None:
    """Make MLflow's launcher (`mlflow run`, `mlflow.projects.run`) leave a run its step already
    ended as the step ended it. After a step exits non-zero the launcher ends the run FAILED
    unless it is ended already, but its check (`mlflow.projects._maybe_set_run_terminated`,
    MLflow 3.17) hands `RunStatus.is_terminated` the status as a string where it takes the
    enum's int, so it never holds: a refusal's KILLED became FAILED. Here it takes both; for an
    int nothing changes. Called in the launcher's own process (`gradshare study`; MLflow imports
    `gradshare.mlflow_plugin` into every process that imports mlflow)."""
    from mlflow.entities import RunStatus

    if getattr(RunStatus.is_terminated, "takes_strings", False):
        return
    by_int = RunStatus.is_terminated

    def is_terminated(status) -> bool:
        return by_int(RunStatus.from_string(status) if isinstance(status, str) else status)

    is_terminated.takes_strings = True
    RunStatus.is_terminated = staticmethod(is_terminated)


def stop_on_sigterm() -> None:
    """SIGTERM ends a step as Ctrl-C does (an exception, so its run is ended FAILED with the
    reason and its processes are stopped), instead of killing it with its run left RUNNING."""
    import signal

    def handler(signum, _frame):
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)


def check_reachable(uri: str) -> None:
    """A tracking server that does not answer is refused at once, naming it (MLflow's own
    client would retry for minutes first)."""
    from gradshare.outbox import unreachable

    if (reason := unreachable(uri)) is not None:
        # SystemExit: one line on stderr, no run anywhere (there is no store to put one in)
        raise SystemExit(f"[gradshare] the tracking server {uri} is unreachable ({reason}): "
                         f"start it (`gradshare server`) or point MLFLOW_TRACKING_URI at one; nothing was done")


STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


def check_study_name(study: str) -> None:
    """A study's name names its experiment and local files (`guard-<study>.log`): letters,
    digits and `._@-` only, so that no name reaches outside the directory it is put in."""
    if not study or not study.strip():
        raise StudyError("the study name is empty: pass -P study=NAME")
    if not STUDY_NAME.fullmatch(study):
        raise StudyError(f"study name {study!r} is not allowed: use 1-128 letters, digits, '.', '_', '@' or "
                         f"'-', starting with a letter or digit (no '/', no '..', no spaces)")


def safe_artifact_path(path: str) -> str:
    """`path` as an artifact path inside a run's artifact directory, or a StudyError: no
    absolute path, no `..` part, no backslash or NUL (a name made from input, a manifest or a
    journal never reaches outside the run, in the store or in a local download)."""
    text = str(path)
    parts = text.split("/")
    if (not text or text.startswith("/") or "\\" in text or "\0" in text or ":" in parts[0]
            or any(p in ("", ".", "..") for p in parts)):
        raise StudyError(f"artifact path {text!r} is not allowed: relative, '/'-separated names only, "
                         f"without '..', '.', empty parts, backslashes or NUL")
    return text


def connect() -> str:
    """Point MLflow at the store (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here), refusing a
    server that does not answer; returns the URI. Reads and writes nothing in it."""
    import mlflow

    os.environ.setdefault("MLFLOW_TRACKING_URI", DEFAULT_URI)
    # MLflow draws a progress bar for every artifact download (each step fetches the plan): off
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    check_reachable(os.environ["MLFLOW_TRACKING_URI"])
    return os.environ["MLFLOW_TRACKING_URI"]


def existing_study(study: str):
    """The study's experiment, or SystemExit with one line: a step that reads a study never
    creates one by naming it (a typo would otherwise leave an empty study behind)."""
    import mlflow

    check_study_name(study)
    uri = connect()
    exp = mlflow.get_experiment_by_name(study)
    if exp is None or exp.lifecycle_stage != "active":
        gone = " (its experiment is deleted)" if exp is not None else ""
        # SystemExit: one line on stderr, no run and no experiment anywhere
        raise SystemExit(f"[gradshare] no study {study!r} in {uri}{gone}: run prepare first "
                         f"(`gradshare prepare --study {study}`); nothing was done")
    return exp


def setup(study: str, create: bool = True):
    """Point MLflow at the store and the study's experiment; returns the experiment id. Only the
    steps that make a study (prepare, study) create its experiment: with `create=False` a study
    that does not exist is refused with one line (`existing_study`)."""
    import mlflow

    if create:
        check_study_name(study)
        connect()
    else:
        existing_study(study)
    exp = mlflow.set_experiment(study)
    if exp.tags.get(EXPERIMENT_KIND) != "custom_model_development":
        # MLflow 3's UI opens a GenAI overview unless told this is model training; with this tag
        # its experiment page redirects to the runs table (`/#/experiments/<id>/runs`).
        client().set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, "custom_model_development")
    from gradshare import orphans

    # Every step first ends the study's runs that nobody is behind any more; never the run a
    # launcher made for this very process (not yet tagged with it).
    orphans.sweep(exp.experiment_id, keep={os.environ.get("MLFLOW_RUN_ID", "")},
                  log=lambda line: print(line, file=sys.stderr))
    return exp.experiment_id


def runs_table(experiment_id: str, base: str = "", run_id: str = "") -> str:
    """The MLflow UI's runs table of a study, or one run's page in it (`base`: the server, e.g.
    http://127.0.0.1:5000). `workflowType=machine_learning` gives it MLflow 3's model-training
    navigation (Runs, Models), as the experiment's own page does when it redirects there; without
    it a fresh browser shows the GenAI one (traces, judges, prompts) beside the same table."""
    run = f"/{run_id}" if run_id else ""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs{run}?workflowType=machine_learning"


def client():
    import mlflow

    return mlflow.MlflowClient()


def search(study: str, step: str, arm: str | None = None, status: str | None = None,
           order: str = "attributes.start_time ASC") -> list:
    """Runs of `study` at `step` (and `arm`), oldest first, through `search_runs` with a filter."""
    import mlflow

    exp = mlflow.get_experiment_by_name(study)
    if exp is None:
        return []
    flt = f"tags.`{STEP}` = '{step}'"
    if arm:
        flt += f" and tags.`{ARM}` = '{arm}'"
    if status:
        flt += f" and attributes.status = '{status}'"
    return client().search_runs([exp.experiment_id], flt, order_by=[order], max_results=1000)


def prepare_run(study: str):
    """The study's one FINISHED prepare run, or a StudyError that says to run prepare."""
    runs = search(study, "prepare", status="FINISHED")
    if not runs:
        raise StudyError(f"study {study!r} has no finished prepare run: run "
                         f"`mlflow run . -e prepare --env-manager local -P study={study}` first")
    if len(runs) > 1:
        raise StudyError(f"study {study!r} has {len(runs)} finished prepare runs; a study has one")
    return runs[0]


def finished_score_steps(study: str) -> list:
    """FINISHED score step runs (the parents; each model's scores are their nested children)."""
    return [r for r in search(study, "score", status="FINISHED") if ARM not in r.data.tags]


def is_committed(study: str) -> bool:
    return bool(search(study, "commit", status="FINISHED"))


def download(run_id: str, artifact_path: str, dst: str | Path | None = None) -> Path:
    """The run's artifact `artifact_path` under `dst` (a new temporary directory by default);
    a path that would land outside `dst` is refused before anything is fetched."""
    import mlflow

    safe_artifact_path(artifact_path)
    dst = Path(dst or tempfile.mkdtemp(prefix="gradshare-"))
    dst.mkdir(parents=True, exist_ok=True)
    got = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                   dst_path=str(dst)))
    if not got.resolve().is_relative_to(dst.resolve()):
        raise StudyError(f"artifact {artifact_path!r} of run {run_id} landed outside {dst}: refused")
    return got


def study_tags(study: str, step: str, plan_sha: str, arm: str | None = None) -> dict:
    tags = {STUDY: study, STEP: step, PLAN_SHA: plan_sha}
    if arm:
        tags[ARM] = arm
    return tags


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StudyError) else str(exc)
    return " ".join(text.split())[:4000]


TRACEBACK = "failure/traceback.txt"  # an unexpected error's traceback, on the run it ended


@contextlib.contextmanager
def study_run(study: str, step: str, plan_sha: str = "", arm: str | None = None,
              run_name: str | None = None, system_metrics: bool = False, create: bool = False):
    """An MLflow run of the study that ends FINISHED; FAILED with a one-line reason; or, where
    the step was refused (`Refusal`), KILLED with the reason and `gradshare.refusal=true`, so
    that the UI tells a refusal from a failure at a glance.

    The study must exist (`create=False`: a step on an unknown study is refused before any run,
    `existing_study`). Reuses the run that `mlflow run` made (MLFLOW_RUN_ID) when it belongs to
    the study's experiment; otherwise starts a new one there. On stderr: the reason in one line
    first; an unexpected error's traceback goes to the run's `failure/traceback.txt`.
    """
    import mlflow

    exp_id = setup(study, create=create)
    # Taken out of the environment: a later start_run(nested=True) would otherwise resume
    # this run instead of creating a child.
    run_id = os.environ.pop("MLFLOW_RUN_ID", None)
    if run_id and client().get_run(run_id).info.experiment_id != exp_id:
        print(f"[gradshare] launcher run {run_id} is outside experiment {study!r}; "
              f"starting the step's run in {study!r} (use --experiment-name {study})", file=sys.stderr)
        run_id = None
    if run_id and client().get_run(run_id).info.status != "RUNNING":
        # A sweep took the launcher's run for an orphan before this step could tag it (a slow
        # environment build): the step is alive after all, so the reason no longer holds.
        client().delete_tag(run_id, FAILURE)
    run = mlflow.start_run(run_id=run_id, experiment_id=exp_id, run_name=run_name,
                           log_system_metrics=system_metrics)
    status, end_tags, texts = "FAILED", {}, {}
    try:
        from gradshare.orphans import process_tags

        mlflow.set_tags(study_tags(study, step, plan_sha, arm) | process_tags())
        yield run
        status = "FINISHED"
    except BaseException as exc:  # KeyboardInterrupt too: a stopped run is FAILED, never RUNNING
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (`stop_on_sigterm`) with its words
            reason = " ".join(str(exc).split()) or "stopped by the user (interrupt)"
        else:
            reason = one_line(exc)
        end_tags = {FAILURE: reason}
        if isinstance(exc, Refusal):  # nothing was attempted: KILLED, MLflow's other terminal status
            status = "KILLED"
            end_tags |= {REFUSAL: "true", "mlflow.runName": f"refused-{step}" + (f"-{arm}" if arm else "")}
        print(f"[gradshare] {step}{f' {arm}' if arm else ''} "
              f"{'refused' if status == 'KILLED' else 'FAILED'}: {reason}", file=sys.stderr, flush=True)
        if not isinstance(exc, StudyError):  # a user's error needs no traceback; anything else keeps one
            texts[TRACEBACK] = traceback.format_exc()
        raise SystemExit(1) from None
    finally:
        stored = False
        try:  # whatever happened above, the run does not stay RUNNING
            stored = end_run(run.info.run_id, status, end_tags, texts)
        finally:
            if texts and stored:
                print(f"[gradshare] its traceback: {TRACEBACK} of run {run.info.run_id} (`mlflow artifacts "
                      f"download -r {run.info.run_id} -a {TRACEBACK}`)", file=sys.stderr, flush=True)
            elif texts:  # the store did not take it: the traceback is not lost
                print(texts[TRACEBACK], file=sys.stderr, end="", flush=True)


def end_run(run_id: str, status: str, tags: dict, texts: dict[str, str] | None = None) -> bool:
    """End the step's run with its tags, first logging `texts` (`{artifact_file: text}`) to it;
    returns whether the store took them (the caller prints them where it did not). Where the
    server does not answer, or the run's earlier records still wait in its outbox, the end waits
    there behind them (`gradshare upload`)."""
    import mlflow

    from gradshare import outbox

    box = outbox.Outbox(run_id, grace_s=0)
    if not box.pending() and outbox.reachable():
        stored = _log_texts(texts or {})
        if tags:
            mlflow.set_tags(tags)
        mlflow.end_run(status)
        shutil.rmtree(box.dir, ignore_errors=True)  # every record is in the store: nothing to keep
        return stored
    box.end(status, tags)
    with outbox.fast_fail():
        try:
            mlflow.end_run(status)  # takes the run off this process's stack; its server call may fail
        except Exception:  # noqa: BLE001 - the end is in the journal
            pass
    if box.pending():
        print(f"[gradshare] the tracking server does not answer: the run's end ({status}) and "
              f"{box.pending()} records wait in {box.dir}; deliver them with `gradshare upload {box.dir}`",
              file=sys.stderr, flush=True)
        raise SystemExit(1)
    return False


def _log_texts(texts: dict[str, str]) -> bool:
    """Text artifacts of the active run; False where the store refused one (the run still ends)."""
    import mlflow

    try:
        for artifact_file, text in texts.items():
            mlflow.log_text(text, safe_artifact_path(artifact_file))
    except Exception:  # noqa: BLE001 - a full or read-only artifact store must not keep the run open
        return False
    return True
