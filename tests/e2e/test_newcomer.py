"""A newcomer's first hour: the design card's command, one study in one experiment, no run
left RUNNING, bad parameters refused before they leave a trace."""
import json
import os
import subprocess
import sys

import mlflow
import pytest

from gradshare.hosts import netns
from gradshare.tracking import orphans
from gradshare.contract.tags import ARM, FAILURE, REFUSAL, STEP, STUDY
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import SMALL, all_runs as _all_runs, mlflow_run_as_typed as _mlflow_run, planted_secrets_found, run_entry

pytestmark = pytest.mark.e2e


def test_the_design_cards_literal_command_without_conda_says_what_to_do_and_leaves_no_run(mlflow_server):
    if any(os.access(os.path.join(d, "conda"), os.X_OK) for d in os.environ["PATH"].split(":")):
        pytest.skip("conda is installed here: the literal command would build its environment and run")
    earlier = _all_runs()
    before = {r.info.run_id for r in earlier}
    proc = _mlflow_run("-e", "train", "-P", "arm=dense")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gradshare:")]
    assert len(lines) == 1 and "add --env-manager local" in lines[0], proc.stderr[-2000:]
    after = _all_runs()
    assert {r.info.run_id for r in after} == before  # nothing recorded at all
    # the server is the session's: another test's killed driver may have left its run RUNNING
    # (the next step of that study sweeps it); this command must not have started or revived any
    was_running = {r.info.run_id for r in earlier if r.info.status == "RUNNING"}
    assert {r.info.run_id for r in after if r.info.status == "RUNNING"} <= was_running


@pytest.fixture(scope="module")
def nameless_study(mlflow_server):
    """Prepared through `mlflow run` with no --experiment-name at all."""
    study = "nameless-study"
    default_before = len(connection.client().search_runs(["0"]))
    args = ["-e", "prepare", "--env-manager", "local", "-P", f"study={study}", "-P", "model.pretrain_steps=1"]
    for k, v in SMALL.items():
        if k != "model.pretrain_steps":
            args += ["-P", f"{k}={v}"]
    proc = _mlflow_run(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return study, default_before


def test_a_study_launched_without_experiment_name_lives_in_its_own_experiment(nameless_study):
    study, default_before = nameless_study
    exp = mlflow.get_experiment_by_name(study)
    runs = connection.client().search_runs([exp.experiment_id])
    assert [r.data.tags.get(STEP) for r in runs] == ["prepare"]  # the launcher's run is the step's run
    assert runs[0].info.status == "FINISHED"
    assert len(connection.client().search_runs(["0"])) == default_before  # nothing landed in Default


def test_an_unknown_arm_creates_no_run_and_names_the_studys_arms(nameless_study):
    """The plugin reads the arms from the study's prepared plan (its `arms.rows`), before any run:
    a name it does not hold is refused naming them, and a study with no plan to train is refused
    naming the prepare command."""
    study, _ = nameless_study
    before = {r.info.run_id for r in _all_runs()}
    proc = _mlflow_run("-e", "train", "--env-manager", "local", "-P", f"study={study}", "-P", "arm=dense2")
    assert proc.returncode != 0
    assert f"-P arm=dense2 is not an arm of study {study!r}: choose one of single, dense, powersgd" in proc.stderr
    unprepared = _mlflow_run("-e", "train", "--env-manager", "local", "-P", "study=never-prepared", "-P", "arm=dense")
    assert unprepared.returncode != 0 and "has no finished prepare run" in unprepared.stderr
    assert {r.info.run_id for r in _all_runs()} == before


def test_with_an_experiment_name_a_bad_arm_is_a_failed_refusal_with_the_studys_arms(nameless_study):
    """MLflow asks the plugin nothing where the command names an experiment: the train step itself
    refuses the arm against the prepared plan (after the test above that counts the study's runs)."""
    study, _ = nameless_study
    proc = _mlflow_run("-e", "train", "--env-manager", "local", "--experiment-name", study,
                       "-P", f"study={study}", "-P", "arm=dense2")
    assert proc.returncode != 0
    exp = mlflow.get_experiment_by_name(study).experiment_id
    [run] = [r for r in connection.client().search_runs([exp]) if r.data.tags.get(REFUSAL) == "true"]
    # the parser ends it KILLED, a refusal; `mlflow run` leaves it so (MLflow 3.17's check for an ended
    # run is broken: the plugin mends it in every `mlflow run`, tracking.mlflow_run_keeps_the_steps_end)
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true"
    reason = run.data.tags[FAILURE]
    assert "dense2" in reason and all(arm in reason for arm in ("single", "dense", "powersgd")), reason


def test_the_next_step_ends_stale_running_runs_failed_with_the_reason(nameless_study):
    study, _ = nameless_study
    c = connection.client()
    exp = mlflow.get_experiment_by_name(study).experiment_id
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = c.create_run(exp, tags={STUDY: study, STEP: "train", ARM: "dense",
                                   orphans.PID: str(gone.pid), orphans.PID_STARTED: "1.0",
                                   orphans.HOST_ID: orphans.process_tags()[orphans.HOST_ID]})
    never_started = c.create_run(exp, tags={"mlflow.project.entryPoint": "train",
                                            "mlflow.project.env": "conda"})
    alive = c.create_run(exp, tags={STUDY: study, STEP: "commit", **orphans.process_tags()})
    try:
        # any step sweeps first; this one is refused (nothing is committed), which is no matter
        run_entry("score", "--study", study, env={orphans.GRACE_ENV: "0"}, check=False)
        got = {r: c.get_run(r) for r in (dead.info.run_id, never_started.info.run_id, alive.info.run_id)}
        d = got[dead.info.run_id]
        assert d.info.status == "FAILED" and d.data.tags[FAILURE].startswith("orphaned: train run of arm dense")
        assert f"process {gone.pid}" in d.data.tags[FAILURE]
        n = got[never_started.info.run_id]
        assert n.info.status == "FAILED" and "ever started" in n.data.tags[FAILURE]
        assert "add --env-manager local" in n.data.tags[FAILURE]  # it asked for conda; none here
        assert got[alive.info.run_id].info.status == "RUNNING"  # this test's own process lives
    finally:
        c.set_terminated(alive.info.run_id, "KILLED")


def test_a_young_untagged_run_is_left_alone_within_the_grace_time(nameless_study):
    study, _ = nameless_study
    c = connection.client()
    exp = mlflow.get_experiment_by_name(study).experiment_id
    young = c.create_run(exp, tags={"mlflow.project.entryPoint": "train"})
    try:
        assert orphans.sweep(exp, log=lambda *_: None) == []  # 120 s grace by default
        assert c.get_run(young.info.run_id).info.status == "RUNNING"
    finally:
        c.set_terminated(young.info.run_id, "KILLED")


def test_the_first_command_puts_every_run_of_the_study_in_its_experiment_and_none_running(first_command_study,
                                                                                            tmp_path):
    """The README's first command (`mlflow run . -e study ... -P new_study=true`, no experiment
    name), on the small plan; then a new study of the same name archives it, launcher run included."""
    study, first, runs = first_command_study.study, first_command_study.proc, first_command_study.runs
    assert "speed and dollars are not the study's" in first.stdout  # a CPU run says what it is
    steps = sorted(r.data.tags.get(STEP, "?") for r in runs)
    assert steps.count("study") == 1 and steps.count("train") == 3 and {"prepare", "commit", "analyze"} <= set(steps)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    # the study's own launcher lived all along: no step took it for an orphan (it is minutes old)
    assert not [r for r in runs if r.data.tags.get(FAILURE, "").startswith("orphaned")]
    assert len(connection.client().search_runs(["0"])) == first_command_study.default_before
    # the two-process arms crossed the emulated link where this machine can make one (root on CI)
    links = {r.data.tags[ARM]: r.data.params.get("link", "") for r in runs if r.data.tags.get(STEP) == "train"}
    want = "loopback: both ranks on one host" if netns.unavailable() else "emulated: two hosts"
    assert links["single"] == "none: one process"
    assert links["dense"].startswith(want) and links["powersgd"].startswith(want), links
    assert f"two-process arms: {want}" in first.stdout
    # `-P link.rate_mbit=200`: MLflow logged `200` on the prepare run before prepare started, and
    # prepare's own `200.0` is not refused as a changed value; the plan holds the number
    [prep] = first_command_study.by_step("prepare")
    assert prep.data.params["link.rate_mbit"] == "200"
    assert json.loads(study_runs.download(prep.info.run_id, "plan.json", tmp_path).read_text())["link"]["rate_mbit"] == 200

    # a new study of the same name archives this one whole, its launcher run included (its
    # runs keep their ids: test_two_hosts reads the arms' wire bytes and the report by id)
    renew = ["-e", "prepare", "--env-manager", "local", "-P", "new_study=true", "-P", f"study={study}"]
    for k, v in {**SMALL, "model.pretrain_steps": "1"}.items():
        renew += ["-P", f"{k}={v}"]
    second = _mlflow_run(*renew, env={orphans.GRACE_ENV: "0"})
    assert second.returncode == 0, second.stderr[-3000:]
    archived = [e for e in connection.client().search_experiments() if e.name.startswith(f"{study}@archived-")]
    assert len(archived) == 1
    moved = connection.client().search_runs([archived[0].experiment_id], max_results=1000)
    assert {r.info.run_id for r in moved} == {r.info.run_id for r in runs}  # the whole first study
    fresh = connection.client().search_runs([mlflow.get_experiment_by_name(study).experiment_id], max_results=1000)
    assert [r.data.tags.get(STEP) for r in fresh] == ["prepare"] and fresh[0].info.status == "FINISHED"


def test_a_misspelt_plan_field_is_refused_before_any_run_with_the_nearest_name(mlflow_server):
    before = {r.info.run_id for r in _all_runs()}
    proc = _mlflow_run("-e", "prepare", "--env-manager", "local", "-P", "study=typo-plan",
                       "-P", "schedule.updatez=3")
    assert proc.returncode != 0
    [line] = [l for l in proc.stderr.splitlines() if l.startswith("gradshare:")]
    assert "schedule.updatez" in line and "did you mean 'schedule.updates'" in line
    assert {r.info.run_id for r in _all_runs()} == before


def test_no_planted_secret_reaches_the_store_of_the_first_commands_study(mlflow_server, first_command_study):
    """The README's first command, every step through `mlflow run` across two emulated hosts, with
    `conftest.PLANTED_SECRETS` in its environment: none reaches this worker's store (the small
    study's worker searches its own, e2e/test_secrets.py)."""
    assert planted_secrets_found(mlflow_server) == []
