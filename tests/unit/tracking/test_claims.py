"""The ledger's decisions (`gradshare.tracking.claims`), on ledgers written out by hand: every
attempt counted, refusals hold nothing, the earlier claim wins. (Claims that race on a real server,
attempts and time limits of real arms: tests/e2e/test_integrity.py.)"""
import pytest

from gradshare.contract.errors import Refusal
from gradshare.tracking import claims


def _entry(index, step, arm, status, refusal=False, run_id=None, attempted=None, interrupted=False):
    attempted = (step == "train" and not refusal) if attempted is None else attempted
    return claims.Entry(index, step, arm, run_id or f"r{index}", status, refusal, None, attempted, interrupted)


def test_a_failed_arm_is_not_re_run_when_the_plan_allows_one_attempt():
    prefix = [_entry(1, "train", "dense", "FAILED")]
    with pytest.raises(Refusal, match="used its 1 attempt"):
        claims.decide_train(prefix, "dense", max_attempts=1)
    assert claims.decide_train(prefix, "dense", max_attempts=2) == 2
    assert claims.decide_train(prefix, "single", max_attempts=1) == 1
    twice = prefix + [_entry(2, "train", "dense", "FAILED")]
    with pytest.raises(Refusal, match="used its 2 attempt"):
        claims.decide_train(twice, "dense", max_attempts=2)


def test_an_interrupted_attempt_keeps_its_number_but_uses_none_of_the_plans_attempts():
    """A study stopped from outside (SIGTERM, Ctrl-C) continues where it stopped: the arm's next
    run is attempt 2 (the interrupted one stays listed as attempt 1), within max_attempts 1. A
    failure after it does use the one attempt."""
    stopped = _entry(1, "train", "dense", "KILLED", interrupted=True)
    assert claims.decide_train([stopped], "dense", max_attempts=1) == 2
    assert claims.decide_train([stopped, _entry(2, "train", "dense", "KILLED", interrupted=True)], "dense", 1) == 3
    failed = [stopped, _entry(2, "train", "dense", "FAILED")]
    with pytest.raises(Refusal, match=r"used its 1 attempt\(s\) allowed by arms.max_attempts \(attempt 2 run r2 FAILED\)"):
        claims.decide_train(failed, "dense", max_attempts=1)
    # listed for the commitment as what it was, beside the attempt that counted
    assert [a["status"] for a in claims.attempts(failed, "dense")] == ["KILLED", "FAILED"]
    # it may still be resumed from a full state, as any stopped attempt
    claims.decide_resume([stopped], "dense", "r1")


def test_a_claimant_that_died_before_its_decision_made_no_attempt():
    died = _entry(1, "train", "dense", "FAILED", attempted=False)  # e.g. Ctrl-C between claim and decision
    assert claims.decide_train([died], "dense", max_attempts=1) == 1
    deciding = _entry(1, "train", "dense", "RUNNING", attempted=False)  # may still become one: blocks
    with pytest.raises(Refusal, match="never overlapping"):
        claims.decide_train([deciding], "dense", max_attempts=1)


def test_refusals_are_not_attempts_and_hold_nothing():
    prefix = [_entry(1, "train", "dense", "KILLED", refusal=True),
              _entry(2, "commit", None, "KILLED", refusal=True)]
    assert claims.decide_train(prefix, "dense", max_attempts=1) == 1
    claims.decide_commit(prefix)  # the refused commit does not count as a commitment
    # a refusal that ended FAILED (a store written before refusals ended KILLED) holds nothing either
    assert claims.decide_train([_entry(1, "train", "dense", "FAILED", refusal=True)], "dense", 1) == 1


def test_a_refused_train_run_is_never_resumed_though_it_ended_killed():
    """`train --resume-from` takes stopped (FAILED or KILLED) attempts: a refusal ends KILLED too,
    and is refused as no attempt, naming why it was refused."""
    refused = claims.Entry(1, "train", "dense", "r1", "KILLED", True, "budget: arm dense would cost $9", False)
    with pytest.raises(Refusal, match=r"run r1 was a refusal \(budget: arm dense would cost \$9\)"):
        claims.decide_resume([refused], "dense", "r1")
    stopped = _entry(1, "train", "dense", "KILLED", run_id="r1")  # a real attempt, stopped: resumable
    claims.decide_resume([stopped], "dense", "r1")  # the entries before the resume's own claim


def test_the_earlier_of_two_claims_wins_and_the_later_names_it():
    first = _entry(1, "commit", None, "RUNNING", run_id="winner")
    claims.decide_commit([])  # the first claimant sees nothing before it
    with pytest.raises(Refusal, match="being committed by run winner"):
        claims.decide_commit([first])
    with pytest.raises(Refusal, match="is being committed"):
        claims.decide_train([first], "powersgd", 1)
    with pytest.raises(Refusal, match="arm dense is still running"):
        claims.decide_commit([_entry(1, "train", "dense", "RUNNING")])
    with pytest.raises(Refusal, match="never overlapping"):
        claims.decide_train([_entry(1, "train", "dense", "RUNNING")], "single", 1)


def test_score_needs_a_finished_commitment_and_happens_once():
    with pytest.raises(Refusal, match="not committed"):
        claims.decide_score([_entry(1, "commit", None, "RUNNING")])
    done = _entry(1, "commit", None, "FINISHED")
    claims.decide_score([done])
    with pytest.raises(Refusal, match="being scored by run r2"):
        claims.decide_score([done, _entry(2, "score", None, "RUNNING")])
