"""The record is complete: every attempt kept, claims that cannot race, arms that cannot hang.
(The ledger's decisions on ledgers written by hand: tests/unit/tracking/test_claims.py.)"""
import json
import re
import subprocess
import sys
import threading

import psutil
import pytest

from gradshare.tracking import claims
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ARM, FAILURE, REFUSAL, STUDY
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import REPO, overrides, run_entry

pytestmark = pytest.mark.e2e

# A tight but honest time limit for the small plan: 24 s of start-up and checkpoint, and
# 8 updates x 1 s x 2 (40 s in all). Small arms take ~15 s on 2 cores.
TIMED = {"arms.startup_s": "24", "arms.expected_update_s": "1", "arms.timeout_margin": "2"}


def _prepare(study: str, extra: dict | None = None) -> str:
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1", **(extra or {})}))
    return study


def _train(study, arm, env=None, check=False):
    return run_entry("train", "--study", study, "--arm", arm, env=env, check=check)


# -- the ledger on a real tracking server --------------------------------------------------

@pytest.fixture(scope="module")
def race_study(mlflow_server):
    return _prepare("race-study")


def test_simultaneous_claims_get_distinct_places_in_the_ledger(race_study):
    import mlflow
    prep = study_runs.prepare_run(race_study).info.run_id
    exp = mlflow.get_experiment_by_name(race_study).experiment_id
    ids = [connection.client().create_run(exp, tags={STUDY: race_study}).info.run_id for _ in range(6)]
    got, start = {}, threading.Barrier(len(ids))

    def claim(run_id):
        start.wait()  # all six write at once
        got[run_id] = claims.append(prep, "probe", None, run_id)

    threads = [threading.Thread(target=claim, args=(r,)) for r in ids]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    for r in ids:
        connection.client().set_terminated(r, "FAILED")
        connection.client().set_tag(r, REFUSAL, "true")  # probes, not steps of the study
    assert sorted(got) == sorted(ids) and len(set(got.values())) == len(ids)
    ledger = {e.run_id: e.index for e in claims.entries(prep)}
    assert all(ledger[r] == got[r] for r in ids)  # what each claimant was told is what the store holds


def _concurrently(step: str, study: str, n: int = 2) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([sys.executable, "-m", f"entrypoints.{step}", "--study", study], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    return [(p, *p.communicate(timeout=600)) for p in procs]


def test_two_concurrent_commits_one_succeeds_the_other_refuses_naming_it(race_study):
    results = _concurrently("commit", race_study)
    assert sorted(p.returncode for p, *_ in results) == [0, 1]
    [winner] = study_runs.search(race_study, "commit", status="FINISHED")
    [loser] = study_runs.search(race_study, "commit", status="KILLED")  # a refusal: KILLED, not FAILED
    assert winner.info.run_id in loser.data.tags[FAILURE]
    assert loser.data.tags[REFUSAL] == "true"


def test_two_concurrent_scores_one_succeeds_the_other_refuses_naming_it(race_study):
    if not study_runs.search(race_study, "commit", status="FINISHED"):
        run_entry("commit", "--study", race_study)
    results = _concurrently("score", race_study)
    assert sorted(p.returncode for p, *_ in results) == [0, 1], [e[-1][-2000:] for e in results]
    [winner] = study_runs.finished_score_steps(race_study)
    [loser] = [r for r in study_runs.search(race_study, "score", status="KILLED") if ARM not in r.data.tags]
    assert loser.data.tags[REFUSAL] == "true"
    assert winner.info.run_id in loser.data.tags[FAILURE]
    assert len(study_runs.search(race_study, "score", "seed", status="FINISHED")) == 1  # scored once


# -- attempts ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_attempts(mlflow_server):
    """dense fails, then finishes, then is refused a third run; single fails once; then committed
    and analysed. (The refusal after two failures is decided on a ledger above.)"""
    study = _prepare("two-attempts", {"arms.max_attempts": "2"})
    nan = {"GRADSHARE_INJECT_NAN_AT": "2"}
    _train(study, "dense", env=nan)
    _train(study, "dense", check=True)
    third = _train(study, "dense")
    _train(study, "single", env=nan)
    run_entry("commit", "--study", study)
    run_entry("analyze", "--study", study)
    return study, third


def _commitment(study, tmp_path):
    [run] = study_runs.search(study, "commit", status="FINISHED")
    return json.loads(study_runs.download(run.info.run_id, "commitment.json", tmp_path).read_text())


def test_a_second_attempt_and_the_first_both_appear_in_the_commitment(two_attempts, tmp_path):
    study, third = two_attempts
    c = {e["arm"]: e for e in _commitment(study, tmp_path)["arms"]}
    dense = c["dense"]
    assert [(a["attempt"], a["status"]) for a in dense["attempts"]] == [(1, "FAILED"), (2, "FINISHED")]
    assert "diverged" in dense["attempts"][0]["failure_reason"]
    assert dense["status"] == "FINISHED" and dense["run_id"] == dense["attempts"][1]["run_id"]
    assert dense["checkpoint_sha256"] == dense["attempts"][1]["checkpoint_sha256"]
    single = c["single"]
    assert [(a["attempt"], a["status"]) for a in single["attempts"]] == [(1, "FAILED")]
    assert single["status"] == "FAILED" and single["run_id"] == single["attempts"][0]["run_id"]
    assert third.returncode != 0 and "already" in third.stderr  # a finished arm is not run again
    assert c["powersgd"]["attempts"] == [] and "unavailable" in c["powersgd"]["failure_reason"]


def test_the_report_shows_every_attempt(two_attempts, tmp_path):
    study, _ = two_attempts
    [run] = study_runs.search(study, "analyze", status="FINISHED")
    report = study_runs.download(run.info.run_id, "report.md", tmp_path).read_text()
    c = {e["arm"]: e for e in _commitment(study, tmp_path / "c")["arms"]}
    for arm in ("dense", "single"):
        for a in c[arm]["attempts"]:
            assert a["run_id"] in report, (arm, a)
    refused = [r for r in study_runs.search(study, "train", "dense") if r.data.tags.get(REFUSAL) == "true"]
    assert refused and all(r.info.run_id not in report for r in refused)  # a refusal is no attempt
    verdicts = json.loads(study_runs.download(run.info.run_id, "verdicts.json", tmp_path).read_text())
    assert len(verdicts["arms"]["dense"]["attempts"]) == 2


# -- time limits ---------------------------------------------------------------------------

def _worker_processes(run_id: str) -> list:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "gradshare.train.worker" in cmd and run_id in cmd:
            out.append(p)
    return out


def test_a_rank_that_sleeps_forever_ends_the_arm_as_hung_within_the_update_bound(mlflow_server):
    """Every rank alive (the sleeper's heartbeat thread beats on, its peer waits in a collective)
    and none completes an update: the arm ends after arms.hang_updates x arms.expected_update_s,
    far below its time limit, FAILED, naming the hang and the last completed update."""
    # a hang bound of 10 s, not 30; a start-up allowance of 120 s, so that on a loaded machine too
    # the hang bound, not the time limit (120 + 8 x 1 x 2 = 136 s), is what ends the arm
    bounds = TIMED | {"arms.stall_s": "10", "arms.hang_updates": "5", "arms.startup_s": "120"}
    study = _prepare("hang-study", bounds)
    plan = load_plan("tiny", bounds)
    limit = plan.arms.timeout_s(8)  # the small plan's 8 updates
    proc = _train(study, "dense", env={"GRADSHARE_INJECT_HANG_AT": "3:1"})
    assert proc.returncode != 0
    [run] = study_runs.search(study, "train", "dense")
    assert run.info.status == "FAILED"
    reason = run.data.tags[FAILURE]
    assert re.match(rf"stalled: arm dense: rank \d on host \S+ made no progress for (\d+) s \(stopped or hung: no "
                    rf"rank completed an update within {plan.arms.hang_s():.0f} s", reason), reason
    assert reason.endswith("last completed update 2 of 8"), reason
    # the hang bound ended it, long before the time limit would have: the product's own figure
    silent = int(re.search(r"made no progress for (\d+) s", reason).group(1))
    assert plan.arms.hang_s() <= silent < limit, (silent, limit)
    assert _worker_processes(run.info.run_id) == []
