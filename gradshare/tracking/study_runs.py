"""MLflow: where every step's run lives, how steps find each other, how failure shows.

Steps talk only through the tracking store: tags, run ids, artifacts. The store is
whatever `MLFLOW_TRACKING_URI` says, else `sqlite:///mlflow.db` in the working
directory. The experiment is the study's name.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.tags import (
    ARM,
    EXPERIMENT_KIND,
    FAILURE,
    INTERRUPTED,
    PLAN_SHA,
    REFUSAL,
    RUN_NAME,
    STEP,
    STUDY,
)
from gradshare.tracking import clock, connection, orphans, outbox, weights_guard


def existing_study(study: str):
    """The study's experiment, or SystemExit with one line: a step that reads a study never
    creates one by naming it (a typo would otherwise leave an empty study behind)."""
    import mlflow

    connection.check_study_name(study)
    uri = connection.connect()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        # asking MLflow would create the database (and print its migrations): a refusal creates nothing
        raise SystemExit(f"[gradshare] no study {study!r} in {uri}: there is no store at "
                         f"{Path(uri[len('sqlite:///'):]).resolve()}; run prepare first "
                         f"(`gradshare prepare --study {study}`); nothing was done")
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
        connection.check_study_name(study)
        connection.connect()
    else:
        existing_study(study)
    exp = mlflow.set_experiment(study)
    if exp.tags.get(EXPERIMENT_KIND) != "custom_model_development":
        # MLflow 3's UI opens a GenAI overview unless told this is model training; with this tag
        # its experiment page redirects to the runs table (`/#/experiments/<id>/runs`).
        connection.client().set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, "custom_model_development")
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
    return connection.client().search_runs([exp.experiment_id], flt, order_by=[order], max_results=1000)


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


def download(run_id: str, artifact_path: str, dst: str | Path) -> Path:
    """The run's artifact `artifact_path` under `dst`, a folder the caller owns (and removes); a
    path that would land outside `dst` is refused before anything is fetched. One file's text:
    `read_text`, which leaves nothing behind."""
    import mlflow

    connection.safe_artifact_path(artifact_path)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    got = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                   dst_path=str(dst)))
    if not got.resolve().is_relative_to(dst.resolve()):
        raise StudyError(f"artifact {artifact_path!r} of run {run_id} landed outside {dst}: refused")
    return got


def read_text(run_id: str, artifact_path: str) -> str:
    """One file artifact's text, fetched into a temporary folder that is removed at once."""
    with tempfile.TemporaryDirectory(prefix="gradshare-") as tmp:
        return download(run_id, artifact_path, tmp).read_text()


def study_tags(study: str, step: str, plan_sha: str, arm: str | None = None) -> dict:
    found = {STUDY: study, STEP: step, PLAN_SHA: plan_sha}
    if arm:
        found[ARM] = arm
    return found


TRACEBACK = "failure/traceback.txt"  # an unexpected error's traceback, on the run it ended


@contextlib.contextmanager
def study_run(study: str, step: str, plan_sha: str = "", arm: str | None = None,
              run_name: str | None = None, system_metrics: bool = False, create: bool = False):
    """An MLflow run of the study that ends FINISHED; FAILED with a one-line reason; where the
    step was refused (`Refusal`), KILLED with the reason and `gradshare.refusal=true`, so that the
    UI tells a refusal from a failure at a glance; where it was stopped from outside (SIGTERM,
    Ctrl-C), KILLED with `interrupted: ...` and `gradshare.interrupted=true`.

    The study must exist (`create=False`: a step on an unknown study is refused before any run,
    `existing_study`). Reuses the run that `mlflow run` made (MLFLOW_RUN_ID) when it belongs to
    the study's experiment; otherwise starts a new one there. On stderr: the reason in one line
    first; an unexpected error's traceback goes to the run's `failure/traceback.txt`. A clock
    that reads earlier than the study's last record (`clock.check`) is a refusal; a server that
    stopped answering under the step is named as such, with what running the step again does.
    """
    import mlflow

    connection.stop_on_sigterm()  # SIGTERM ends the step as Ctrl-C does: its run KILLED, "interrupted"
    exp_id = setup(study, create=create)
    # Taken out of the environment: a later start_run(nested=True) would otherwise resume
    # this run instead of creating a child.
    run_id = os.environ.pop("MLFLOW_RUN_ID", None)
    if run_id and connection.client().get_run(run_id).info.experiment_id != exp_id:
        print(f"[gradshare] launcher run {run_id} is outside experiment {study!r}; "
              f"starting the step's run in {study!r} (use --experiment-name {study})", file=sys.stderr)
        run_id = None
    if run_id and connection.client().get_run(run_id).info.status != "RUNNING":
        # A sweep took the launcher's run for an orphan before this step could tag it (a slow
        # environment build): the step is alive after all, so the reason no longer holds.
        connection.client().delete_tag(run_id, FAILURE)
    run = mlflow.start_run(run_id=run_id, experiment_id=exp_id, run_name=run_name,
                           log_system_metrics=system_metrics)
    status, end_tags, texts = "FAILED", {}, {}
    said, lost = "", False
    try:
        mlflow.set_tags(study_tags(study, step, plan_sha, arm) | orphans.process_tags())
        # a clock that went back would make the deadline and spend lie: refused before any work
        clock.check(exp_id, exclude={run.info.run_id})
        yield run
        status = "FINISHED"
    except BaseException as exc:  # KeyboardInterrupt too: a stopped run is FAILED, never RUNNING
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (`stop_on_sigterm`) with its words
            reason = "interrupted: " + (" ".join(str(exc).split()) or "stopped by the user (interrupt)")
        elif (not isinstance(exc, (StudyError, outbox.ServerLost))  # those say it themselves
              and (gone := connection.unreachable()) is not None):
            # the server went away under the step: say so, not the request that happened to fail
            reason, lost = lost_server_reason(step, run.info.run_id, gone), True
        else:
            reason = connection.one_line(exc)
        end_tags = {FAILURE: reason}
        if isinstance(exc, Refusal):  # nothing was attempted: KILLED, MLflow's other terminal status
            status = "KILLED"
            end_tags |= {REFUSAL: "true", RUN_NAME: f"refused-{step}" + (f"-{arm}" if arm else "")}
        elif isinstance(exc, KeyboardInterrupt):  # stopped from outside: KILLED, no attempt used (`claims`)
            status = "KILLED"
            end_tags |= {INTERRUPTED: "true"}
        word = "FAILED" if status == "FAILED" else "refused" if REFUSAL in end_tags else "interrupted"
        said = f"[gradshare] {step}{f' {arm}' if arm else ''} {word}: {reason}"
        print(said, file=sys.stderr, flush=True)
        # a user's error, a lost server or a stop from outside needs none: its line says it all (an
        # interrupted step's traceback is where a signal happened to land, and writing it once
        # failed while the stop was under way, printing it as though something had gone wrong)
        if not isinstance(exc, (StudyError, KeyboardInterrupt)) and not lost:
            texts[TRACEBACK] = traceback.format_exc()
        raise SystemExit(1) from None
    finally:
        stored = False
        try:  # whatever happened above, the run does not stay RUNNING
            stored = end_run(run.info.run_id, status, end_tags, texts, said=said)
        finally:
            if texts and stored:
                print(f"[gradshare] its traceback: {TRACEBACK} of run {run.info.run_id} (`mlflow artifacts "
                      f"download -r {run.info.run_id} -a {TRACEBACK}`)", file=sys.stderr, flush=True)
            elif texts:  # the store did not take it: the traceback is not lost
                print(texts[TRACEBACK], file=sys.stderr, end="", flush=True)


AGAIN = {"commit": "running `commit` again is safe: this run ends FAILED and seals nothing, and the study's "
                   "ledger lets exactly one commit finish",
         "score": "running `score` again is safe: this run ends FAILED, and the ledger lets exactly one score finish",
         "train": "this attempt ends FAILED; `train` again starts the arm's next attempt (or `-P resume_from=<run id>` "
                  "continues it from a full state)"}
"""What running a step again does after the server went away under it (any other: it starts afresh)."""


def lost_server_reason(step: str, run_id: str, why: str) -> str:
    """The one line of a step whose tracking server stopped answering in the middle of it: that
    fault, what running the step again does, and where the run's end waits."""
    import mlflow

    box = outbox.Outbox(run_id, grace_s=0)
    again = AGAIN.get(step, f"running `{step}` again is safe: this run ends FAILED and the next one starts afresh")
    return (f"tracking: the tracking server {mlflow.get_tracking_uri()} stopped answering during {step} ({why}); "
            f"once it answers, {again}. This run's end waits in {box.dir} (`gradshare upload {box.dir}`)")


def end_run(run_id: str, status: str, tags: dict, texts: dict[str, str] | None = None, said: str = "") -> bool:
    """End the step's run with its tags, first logging `texts` (`{artifact_file: text}`) to it;
    returns whether the store took them (the caller prints them where it did not). Where the
    server does not answer, or the run's earlier records still wait in its outbox, the end waits
    there behind them (`gradshare upload`), and one line says which of the two it is, unless the
    line the step already printed (`said`) named that outbox."""
    import mlflow

    box = outbox.Outbox(run_id, grace_s=0, log=lambda line: None)  # its words on a lost server: one line below
    if not box.pending() and outbox.reachable():
        stored = _log_texts(texts or {})
        if tags:
            mlflow.set_tags(tags)
        mlflow.end_run(status)
        if (why := weights_guard.unstored_weights(box.dir)) is None:
            shutil.rmtree(box.dir, ignore_errors=True)  # every record is in the store: nothing to keep
        else:
            print(weights_guard.kept_line(box.dir, why), file=sys.stderr, flush=True)
        return stored
    box.end(status, tags)
    with outbox.fast_fail():
        try:
            mlflow.end_run(status)  # takes the run off this process's stack; its server call may fail
        except Exception:  # noqa: BLE001 - the end is in the journal
            pass
    if box.pending():
        if str(box.dir) not in said:
            if (why := connection.unreachable()) is not None:
                print(f"[gradshare] the tracking server does not answer ({why}): the run's end ({status}) and "
                      f"{box.pending()} records wait in {box.dir}; deliver them with `gradshare upload {box.dir}`",
                      file=sys.stderr, flush=True)
            else:  # it answers: what waits is behind a record the store refused (full, read-only)
                print(f"[gradshare] the tracking store refused a record of this run: {box.pending()} records, the "
                      f"run's end among them, wait behind it in {box.dir}; make room in the store (or let it "
                      f"write), then `gradshare upload {box.dir}`", file=sys.stderr, flush=True)
        raise SystemExit(1)
    return False


def _log_texts(texts: dict[str, str]) -> bool:
    """Text artifacts of the active run; False where the store refused one (the run still ends)."""
    import mlflow

    try:
        for artifact_file, text in texts.items():
            mlflow.log_text(text, connection.safe_artifact_path(artifact_file))
    except Exception:  # noqa: BLE001 - a full or read-only artifact store must not keep the run open
        return False
    return True
