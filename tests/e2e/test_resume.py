"""Full-state checkpoints and exact recovery: an arm killed (SIGKILL to one rank) after its
full state at update 4 ends FAILED naming its last update, with no process left; resumed in
its own run, it ends with the same final checkpoint SHA-256 as an uninterrupted arm; a full state with a flipped byte, a missing rank's file, or
no manifest is refused with a message naming the file, and nothing is loaded from it. (Full
states on local files and two gloo ranks: tests/unit/train/test_fullstate.py.)"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gradshare.contract import metrics as M
from gradshare.contract.tags import CKPT_SHA, FAILURE, PLAN_SHA, REFUSAL
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import SMALL_ARMS, overrides, run_entry

pytestmark = pytest.mark.e2e

# The suite's small study (8 updates) is the straight one; a second study of the same plan
# saves a full state after update 4 and has one rank SIGKILLed at the start of update 5.
SAVED, KILLED_AT, UPDATES = 4, 5, 8
ARMS = ("single", "dense", "powersgd")


@pytest.fixture(scope="module")
def studies(mlflow_server, trained_study):
    """The same plan twice: `trained_study` trained every arm straight through, "resumed" kills
    each arm after its full state at update 4 and resumes it."""
    run_entry("prepare", "--study", "resumed", *overrides(SMALL_ARMS))  # the small study's plan
    for arm in ARMS:
        victim = 0 if arm == "single" else 1
        killed = run_entry("train", "--study", "resumed", "--arm", arm, "--full-state-every", str(SAVED),
                           check=False, env={"GRADSHARE_INJECT_KILL_AT": f"{KILLED_AT}:{victim}"})
        assert killed.returncode != 0
    return SimpleNamespace(artifacts=mlflow_server.artifacts, straight=trained_study)


def _run(study: str, arm: str):
    """The arm's one attempt (refused resumes are runs of their own, never the attempt)."""
    [run] = [r for r in study_runs.search(study, "train", arm) if r.data.tags.get(REFUSAL) != "true"]
    return run


def _stored(mlflow_server, run_id: str, name: str) -> Path:
    [path] = list(Path(mlflow_server.artifacts).rglob(f"{run_id}/artifacts/full_state/u{SAVED:05d}/{name}"))
    return path


def test_the_same_inputs_in_both_studies(studies):
    a, b = study_runs.search(studies.straight, "prepare")[0], study_runs.search("resumed", "prepare")[0]
    assert a.data.tags[PLAN_SHA] == b.data.tags[PLAN_SHA]
    assert a.data.tags["gradshare.inputs_sha256"] == b.data.tags["gradshare.inputs_sha256"]


def test_a_corrupted_or_incomplete_full_state_is_refused_naming_the_file(studies):
    run = _run("resumed", "powersgd")
    assert run.info.status == "FAILED"
    rank1 = _stored(studies, run.info.run_id, "rank1.pt")
    good = rank1.read_bytes()
    try:
        flipped = bytearray(good)
        flipped[len(flipped) // 2] ^= 0x01
        rank1.write_bytes(bytes(flipped))
        proc = run_entry("train", "--study", "resumed", "--arm", "powersgd", "--resume-from", run.info.run_id,
                         check=False)
        assert proc.returncode != 0
        assert "rank1.pt: its bytes do not match the manifest's SHA-256" in proc.stderr
        rank1.unlink()  # one rank's error feedback missing
        proc = run_entry("train", "--study", "resumed", "--arm", "powersgd", "--resume-from", run.info.run_id,
                         check=False)
        assert proc.returncode != 0 and f"rank1.pt: missing from the full state of update {SAVED}" in proc.stderr
    finally:
        rank1.write_bytes(good)
    # the stopped run is untouched by the refused resumes: still FAILED, still resumable
    assert connection.client().get_run(run.info.run_id).info.status == "FAILED"
    refusals = [r for r in study_runs.search("resumed", "train", "powersgd") if r.data.tags.get(REFUSAL) == "true"]
    assert len(refusals) == 2


def test_a_killed_rank_ends_the_arm_failed_with_its_last_update_and_no_process_left(studies):
    """The other rank (or the launcher, for one process) sees the peer gone and exits: the arm
    ends well within the plan's process-group timeout, its reason naming the last update."""
    import psutil

    from gradshare.tracking import store
    _, plan = store.prepared_plan("resumed")
    for arm in ARMS:
        run = _run("resumed", arm)
        assert run.info.status == "FAILED"
        reason = run.data.tags[FAILURE]
        assert reason.endswith(f"; last completed update {SAVED} of {UPDATES}"), reason
        # one line: the rank, its host, the signal; the chain of errors in an artifact instead
        victim = 0 if arm == "single" else 1
        assert reason.startswith(f"arm {arm}: rank {victim} on host ") and "killed by SIGKILL" in reason, reason
        assert "\n" not in reason and len(reason) < 300 and "RuntimeError" not in reason, reason
        details = study_runs.read_text(run.info.run_id, "failure/details.txt")
        assert "SIGKILL" in details or "exitcode  : -9" in details, details[-2000:]
        # from the last logged update to the run's end: the survivors' exit, the launcher's wait
        last = max(m.timestamp for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))
        took_s = (run.info.end_time - last) / 1000
        assert 0 < took_s < plan.arms.timeout_s(UPDATES), (arm, took_s)
        left = [p for p in psutil.process_iter(["cmdline"]) if run.info.run_id in " ".join(p.info["cmdline"] or [])]
        assert not left, [p.info["cmdline"] for p in left]


@pytest.mark.parametrize("arm", ARMS)
def test_a_killed_arm_resumed_from_its_full_state_ends_byte_identical(studies, arm):
    run = _run("resumed", arm)
    assert run.info.status == "FAILED"
    steps = [m.step for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S)]
    assert max(steps) == SAVED  # killed at the start of the next update
    run_entry("train", "--study", "resumed", "--arm", arm, "--resume-from", run.info.run_id)
    after = connection.client().get_run(run.info.run_id)
    straight = _run(studies.straight, arm)
    assert after.info.status == "FINISHED" and straight.info.status == "FINISHED"
    assert after.data.tags[CKPT_SHA] == straight.data.tags[CKPT_SHA]
    assert after.data.tags["gradshare.resumed_from_update"] == str(SAVED)
    # one run per attempt: updates 1-4 from before the kill, 5-8 after the resume, once each
    steps = sorted(m.step for m in connection.client().get_metric_history(run.info.run_id, M.STEP_S))
    assert steps == list(range(1, UPDATES + 1))
    losses = [m.value for m in sorted(connection.client().get_metric_history(run.info.run_id, M.TRAIN_LOSS), key=lambda m: m.step)]
    straight_losses = [m.value for m in sorted(connection.client().get_metric_history(straight.info.run_id, M.TRAIN_LOSS),
                                               key=lambda m: m.step)]
    assert losses == straight_losses
    assert after.data.metrics[M.FULL_STATE_BYTES] > 0 and M.FULL_STATE_LOAD_S in after.data.metrics


def test_the_commitment_and_the_report_say_which_arms_were_resumed(studies):
    for arm in ARMS:  # the parametrised test above may have run in another order
        run = _run("resumed", arm)
        if run.info.status != "FINISHED":
            run_entry("train", "--study", "resumed", "--arm", arm, "--resume-from", run.info.run_id)
    run_entry("commit", "--study", "resumed")
    from gradshare.tracking import store
    _, commitment = store.commitment("resumed")
    resumed = [e for e in commitment["arms"] if e["arm"] in ARMS]  # the plan's fourth arm never ran here
    assert len(resumed) == len(ARMS)
    for entry in resumed:
        assert entry["status"] == "FINISHED"
        [attempt] = entry["attempts"]
        assert attempt["resumed_after_updates"] == [SAVED] and attempt["full_state_bytes"] > 0
    from analysis.analyze import analyze

    _, out = analyze("resumed")
    md = (out / "report.md").read_text()
    assert md.count(f"resumed after update {SAVED}; full state") == 3


# --- the format itself -------------------------------------------------------------------
