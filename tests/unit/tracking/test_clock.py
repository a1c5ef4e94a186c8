"""A clock that went back between steps: the step is refused naming the skew, and the deadline
and spend arithmetic never shows a negative figure."""
from __future__ import annotations

import time

import pytest

from gradshare.contract import metrics as M
from gradshare.contract.errors import Refusal
from gradshare.contract.tags import ARM, ATTEMPT, FAILURE, REFUSAL, RUN_NAME, STEP
from gradshare.cost.limits import Limits
from gradshare.tracking import clock, connection, study_runs


def _study_with_a_run_ended_now(name: str) -> tuple[str, float]:
    """A study whose last record is a run that ended at this machine's real time: (its id, that
    end as the store holds it, seconds since the epoch)."""
    c = connection.client()
    exp = c.create_experiment(name)
    run = c.create_run(exp, tags={STEP: "prepare", RUN_NAME: "prepare"})
    c.set_terminated(run.info.run_id, "FINISHED")
    return exp, c.get_run(run.info.run_id).info.end_time / 1000


def test_a_step_on_a_clock_set_back_ten_minutes_is_refused_killed_naming_the_skew(mlflow_server, monkeypatch,
                                                                                 capsys):
    """The fault seen: a clock set back 600 s between prepare and an arm. The step's run ends
    KILLED as a refusal (named `refused-...`, tagged), its reason naming the seconds and what
    to do; the step's body never runs (nothing attempted)."""
    study = "clock-set-back"
    exp, ended = _study_with_a_run_ended_now(study)
    # 600 s before the stored record, whatever the seconds this test takes on a busy machine
    monkeypatch.setattr(clock, "now", lambda: ended - 600)
    ran = []
    with pytest.raises(SystemExit):
        with study_runs.study_run(study, "train", arm="dense", run_name="train-dense"):
            ran.append(True)
    assert not ran
    [run] = connection.client().search_runs([exp], f"tags.`{STEP}` = 'train'")
    reason = run.data.tags[FAILURE]
    assert run.info.status == "KILLED" and run.data.tags[REFUSAL] == "true", run.info.status
    assert run.data.tags[RUN_NAME] == "refused-train-dense" and ATTEMPT not in run.data.tags
    assert reason.startswith("clock: ") and "before the study's last record" in reason, reason
    skew = float(reason.split(", ")[1].split(" s before")[0])
    assert skew == pytest.approx(600, abs=0.5), reason  # the 600 s, as the reason rounds it
    assert "Set the clock right" in reason and "run the step again" in reason
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[gradshare] train dense refused: {reason}"], err


def test_a_clock_behind_by_less_than_the_tolerance_runs_the_step(mlflow_server, monkeypatch):
    """Two hosts' clocks never agree to the millisecond: a few seconds behind the last record
    (inside `clock.TOLERANCE_S`) is no fault."""
    study = "clock-slightly-behind"
    exp, ended = _study_with_a_run_ended_now(study)
    monkeypatch.setattr(clock, "now", lambda: ended - clock.TOLERANCE_S / 2)
    with study_runs.study_run(study, "commit", run_name="commit"):
        pass
    [run] = connection.client().search_runs([exp], f"tags.`{STEP}` = 'commit'")
    assert run.info.status == "FINISHED" and FAILURE not in run.data.tags


def test_the_check_reads_the_latest_start_or_end_and_skips_the_steps_own_run(mlflow_server):
    """The study's last record is the latest start or end of any run but the step's own: a run
    that started in the future (stamped by a clock ahead) counts; the own run does not."""
    c = connection.client()
    exp = c.create_experiment("clock-latest-record")
    t = time.time()
    old = c.create_run(exp, start_time=int((t - 7200) * 1000), tags={STEP: "prepare"})
    c.set_terminated(old.info.run_id, "FINISHED", end_time=int((t - 3600) * 1000))
    assert clock.last_record(exp)[0] == pytest.approx(t - 3600, abs=0.01)
    clock.check(exp, at=t - 3600)  # exactly at the last record: fine
    with pytest.raises(Refusal, match=r"clock: .* 3600 s before"):
        clock.check(exp, at=t - 7200)
    ahead = c.create_run(exp, start_time=int((t + 900) * 1000), tags={STEP: "train", ARM: "dense"})
    with pytest.raises(Refusal, match=r"900 s before the study's last record \(the start of run"):
        clock.check(exp, at=t)
    clock.check(exp, exclude={ahead.info.run_id}, at=t)  # the step's own run is not the study's past
    # ended: a RUNNING run left on the worker's server fails later tests that count RUNNING runs
    # (tests/unit/entrypoints/test_bad_input.py, when both modules fall to one xdist worker)
    c.set_terminated(ahead.info.run_id, "FINISHED")


def test_spend_and_study_hours_are_never_negative_on_a_clock_read_before_the_start():
    """What the issue saw: `spend/study_hours` = -0.150 on a clock 9 minutes behind prepare. The
    figures are differences of clock readings; a reading before the start counts as none."""
    start = 1_800_000_000.0
    limits = Limits(start_epoch=start, deadline_epoch=start + 3600, budget_usd=10.0, spent_before_usd=0.25,
                    usd_per_s=0.001, cross_usd_per_byte=0.0, arm_start_epoch=start + 60, updates=8)
    early = limits.step_metrics(start - 540, 0.0)
    assert early[M.STUDY_HOURS] == 0.0 and early[M.SPEND_USD] == 0.25
    later = limits.step_metrics(start + 60 + 360, 0.0)
    assert later[M.STUDY_HOURS] == pytest.approx(0.1166666, rel=1e-5)
    assert later[M.SPEND_USD] == pytest.approx(0.25 + 0.36)
