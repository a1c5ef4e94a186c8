"""The study's ledger: claims that cannot race, for the steps that must happen once or alone.

An arm's start, the commitment and the scoring each begin by appending one entry to
the ledger, then decide from the entries *before* their own whether they may go on.
The ledger is a sequence of MLflow parameters `claim.00001`, `claim.00002`, … on the
study's prepare run, each `step:arm:run_id`. MLflow parameters are immutable: the
store's unique key (run, param key) lets exactly one of two simultaneous writers of a
key succeed, and refuses the other ("Changing param values is not allowed"), which then
takes the next key. So the entries are totally ordered, and every claimant sees every
entry before its own:

    index = claims.append(prep_run_id, "commit", None, own_run_id)
    claims.decide_commit(claims.entries(prep_run_id, before=index))   # raises Refusal

Two commits at once: the one with the lower index sees no live commit before it and
proceeds; the other sees it and refuses naming its run. A train that claims after a
commit (finished, or still running) refuses; a commit that finds a train still running
before it refuses. A live entry is one whose run is RUNNING or FINISHED; a run that was
refused (KILLED, tagged `gradshare.refusal`) or failed no longer holds anything, and a refusal
is never an attempt, whatever its status. A train run stopped from outside (KILLED, tagged
`gradshare.interrupted`) keeps its attempt number but uses none of `arms.max_attempts`. The ledger is visible in the UI as the
prepare run's `claim.*` parameters, in order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.tags import ATTEMPT, FAILURE, INTERRUPTED, REFUSAL
from gradshare.tracking import connection


PREFIX = "claim."
LIVE = ("RUNNING", "SCHEDULED", "FINISHED")


@dataclass(frozen=True)
class Entry:
    index: int
    step: str
    arm: str | None
    run_id: str
    status: str  # the run's status when read: RUNNING, FINISHED, FAILED, KILLED, or MISSING
    refusal: bool  # the run was refused (it ends KILLED): it is no attempt and holds nothing
    reason: str | None = None
    attempted: bool = False  # the run was told it may start (tag gradshare.attempt)
    interrupted: bool = False  # stopped from outside (KILLED, tag gradshare.interrupted): used no attempt

    @property
    def live(self) -> bool:
        return self.status in LIVE and not self.refusal

    @property
    def attempt(self) -> bool:
        """A train entry that was allowed to start (whatever became of it). A claimant that
        died between its claim and its decision made no attempt; while it is still RUNNING
        it counts, so that it blocks as the attempt it may become."""
        return self.step == "train" and not self.refusal and (self.attempted or self.status in LIVE)


def _key(index: int) -> str:
    return f"{PREFIX}{index:05d}"


def _raw(prep_run_id: str) -> dict[int, str]:
    params = connection.client().get_run(prep_run_id).data.params
    return {int(k[len(PREFIX):]): v for k, v in params.items() if k.startswith(PREFIX)}


def check_atomic_store() -> None:
    """Claims need a store that refuses a second value for a param key atomically: a SQL
    database, directly or behind a tracking server. MLflow's file store checks, then writes."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    scheme = uri.split(":", 1)[0] if "://" in uri or uri.startswith(("file:", "sqlite:")) else "file"
    if scheme == "file":
        raise StudyError(f"the tracking store {uri} is a file store, whose parameters can be written "
                           f"twice at once: claims cannot be atomic there. Use sqlite:///mlflow.db (the "
                           f"default) or a tracking server")


def append(prep_run_id: str, step: str, arm: str | None, run_id: str, tries: int = 200) -> int:
    """Write `step:arm:run_id` at the next free index of the ledger; returns that index."""
    from mlflow.exceptions import MlflowException

    check_atomic_store()
    value = f"{step}:{arm or '-'}:{run_id}"
    for attempt in range(tries):
        raw = _raw(prep_run_id)
        mine = [i for i, v in raw.items() if v == value]
        if mine:  # an earlier try of ours went through before its answer was lost
            return mine[0]
        index = max(raw, default=0) + 1
        try:
            connection.client().log_param(prep_run_id, _key(index), value)
        except MlflowException:
            # Another claimant took this index (or SQLite was busy): read again, take the next.
            time.sleep(0.05 * (1 + attempt % 5))
            continue
        if _raw(prep_run_id).get(index) == value:  # checked after writing
            return index
    raise StudyError(f"could not write a claim on prepare run {prep_run_id} after {tries} tries: "
                       f"is the tracking store reachable?")


def entries(prep_run_id: str, before: int | None = None) -> list[Entry]:
    """The ledger in order (only entries with index < `before`), with each run's status now."""
    from mlflow.exceptions import MlflowException

    out = []
    for index, value in sorted(_raw(prep_run_id).items()):
        if before is not None and index >= before:
            continue
        step, arm, run_id = value.split(":", 2)
        try:
            run = connection.client().get_run(run_id)
            status, tags = run.info.status, run.data.tags
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise  # a store that could not answer says nothing about the claim: never read as absent
            status, tags = "MISSING", {}
        out.append(Entry(index, step, None if arm == "-" else arm, run_id, status,
                         tags.get(REFUSAL) == "true", tags.get(FAILURE), ATTEMPT in tags,
                         tags.get(INTERRUPTED) == "true"))
    return out


def _live(prefix: list[Entry], step: str) -> list[Entry]:
    return [e for e in prefix if e.step == step and e.live]


def decide_train(prefix: list[Entry], arm: str, max_attempts: int) -> int:
    """The attempt number this train run is, or a Refusal naming the entry in the way."""
    done = [e for e in prefix if e.step == "train" and e.arm == arm and e.live and e.status == "FINISHED"]
    if done:
        raise Refusal(f"arm {arm} already finished (run {done[0].run_id}); each arm trains once, "
                        f"nothing is re-run behind the plan")
    if commits := _live(prefix, "commit"):
        c = commits[0]
        state = "is committed" if c.status == "FINISHED" else "is being committed"
        raise Refusal(f"the study {state} (commit run {c.run_id}): its candidates are sealed and no "
                        f"new train run may start; prepare a new study to train again")
    running = [e for e in prefix if e.step == "train" and e.live and e.status != "FINISHED"]
    if running:
        r = running[0]
        raise Refusal(f"arm {r.arm} is running (run {r.run_id}); arms run one after another, never "
                        f"overlapping: wait for it, or end it (a stale RUNNING run blocks every arm)")
    earlier = [e for e in prefix if e.attempt and e.arm == arm]
    # an attempt stopped from outside (interrupted) stays numbered and listed, but uses none of
    # the plan's attempts: the study continues where it stopped
    used = [e for e in earlier if not e.interrupted]
    if len(used) >= max_attempts:
        listed = ", ".join(f"attempt {i} run {e.run_id} {e.status}" for i, e in enumerate(earlier, 1)
                           if not e.interrupted)
        raise Refusal(f"arm {arm} has used its {max_attempts} attempt(s) allowed by arms.max_attempts "
                        f"({listed}); nothing is re-run behind the plan")
    return len(earlier) + 1


def decide_resume(prefix: list[Entry], arm: str, run_id: str) -> None:
    """A stopped attempt of `arm` may continue in its own run (`train --resume-from`), or a
    Refusal naming what is in the way."""
    if refused := [e for e in prefix if e.run_id == run_id and e.refusal]:
        raise Refusal(f"run {run_id} was a refusal ({refused[0].reason}), not an attempt of arm {arm}: "
                        f"nothing to resume")
    own = [e for e in prefix if e.step == "train" and e.run_id == run_id and e.attempt]
    if not own or own[0].arm != arm:
        raise Refusal(f"run {run_id} is no attempt of arm {arm} in this study's ledger: nothing to resume")
    done = [e for e in prefix if e.step == "train" and e.arm == arm and e.live and e.status == "FINISHED"]
    if done:
        raise Refusal(f"arm {arm} already finished (run {done[0].run_id}); nothing to resume")
    if commits := _live(prefix, "commit"):
        raise Refusal(f"the study is committed (commit run {commits[0].run_id}): a stopped arm can no longer "
                        f"be resumed; it stays as committed")
    running = [e for e in prefix if e.step == "train" and e.live and e.status != "FINISHED" and e.run_id != run_id]
    if running:
        r = running[0]
        raise Refusal(f"arm {r.arm} is running (run {r.run_id}); arms run one after another, never overlapping")
    resuming = [e for e in prefix if e.step == "resume" and e.run_id == run_id and e.status == "RUNNING"]
    if resuming:
        raise Refusal(f"run {run_id} is being resumed already (ledger entry {resuming[0].index})")
    later = [e for e in prefix if e.attempt and e.arm == arm and e.index > own[0].index]
    if later:
        raise Refusal(f"run {run_id} is not arm {arm}'s last attempt (run {later[-1].run_id} came after it)")


def decide_commit(prefix: list[Entry]) -> None:
    if commits := _live(prefix, "commit"):
        c = commits[0]
        state = "already committed" if c.status == "FINISHED" else "being committed"
        raise Refusal(f"the study is {state} by run {c.run_id}; a commitment is made once")
    running = [e for e in prefix if e.step == "train" and e.live and e.status != "FINISHED"]
    if running:
        r = running[0]
        raise Refusal(f"arm {r.arm} is still running (run {r.run_id}); commit after every arm has ended")


def decide_score(prefix: list[Entry]) -> None:
    commits = _live(prefix, "commit")
    if not commits or commits[0].status != "FINISHED":
        what = f"commit run {commits[0].run_id} has not finished" if commits else "no commitment exists"
        raise Refusal(f"the study is not committed ({what}): no test case is scored before every "
                        f"candidate is sealed; run the commit step first")
    if scores := _live(prefix, "score"):
        s = scores[0]
        state = "already scored" if s.status == "FINISHED" else "being scored"
        raise Refusal(f"the study is {state} by run {s.run_id}; scores are made once per commitment")


def attempts(prefix: list[Entry], arm: str) -> list[dict]:
    """Every attempt of `arm` in the ledger, in order, as the commitment records them."""
    return [{"attempt": i, "run_id": e.run_id, "status": e.status, "failure_reason": e.reason}
            for i, e in enumerate((e for e in prefix if e.attempt and e.arm == arm), start=1)]
