"""What the end of an arm's launch makes of the arm, once every process of it has stopped: recorded
whole (every update and the checkpoint done, whatever ended after), or ended by an exception the
train step turns into the run's end: KeyboardInterrupt (Ctrl-C reached the ranks: KILLED,
interrupted), Refusal (the machine's fault: no attempt used), StudyError (stalled, timed out or
failed: FAILED, with the arm's last completed update and where its weights wait).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.plan import Plan
from gradshare.tracking.outbox import Outbox
from gradshare.train import failures, result
from gradshare.train import workdir as workdir_files
from gradshare.train.arm_record import keep_text, last_update, weights_hint
from gradshare.train.link_check import LINK_REFUSAL


def settle(plan: Plan, arm: str, workdir: Path, run_id: str, rc: int | None, stalled: StudyError | None) -> None:
    """Returns where the arm trained whole; raises otherwise. `rc` is the launcher's exit code (None
    where the watch stopped the arm, `stalled` saying why); `run_id` is empty on a host that holds
    no run of the arm."""
    if rc != 0 and trained_whole(workdir):
        # Every update done and the checkpoint written (rank 0's summary, no rank's reason): a
        # process that died or hung after that (the launcher, a rank killed after the checkpoint,
        # a rank stuck in the last barrier, rank 0 stopped while it recorded) costs nothing. The
        # arm is recorded whole, here if need be.
        how = f"the launcher ended with code {rc}" if stalled is None else f"the arm was stopped ({stalled})"
        print(f"[gradshare] arm {arm}: {how} after every update and the checkpoint were done: the arm is "
              f"recorded whole", file=sys.stderr, flush=True)
        if run_id:
            summary = json.loads((workdir / workdir_files.SUMMARY).read_text())
            result.complete(Outbox(run_id, plan.arms.tracking_grace_s), summary,
                            lambda line: print(line, file=sys.stderr, flush=True))
        return
    if stalled is not None:
        last = f"; last completed update {last_update(run_id)} of {plan.schedule.updates}" if run_id else ""
        raise StudyError(f"{stalled}{last}{weights_hint(run_id, str(stalled))}") from None
    if rc != 0:
        reason, details = failures.explain(workdir, arm, rc)
        if run_id:  # the whole chain of errors, whichever way the reason ends the arm
            keep_text(plan, run_id, details, "failure/details.txt")
        if reason.startswith(failures.INTERRUPTED_WORDS):  # Ctrl-C reached the ranks (their process group): an interrupt
            raise KeyboardInterrupt(reason)
        if reason.startswith((workdir_files.WORKDIR_CHANGED, LINK_REFUSAL)):  # the machine's fault: no attempt used
            raise Refusal(reason)
        if run_id:
            if not reason.startswith(failures.SAYS_WHERE):
                reason += f"; last completed update {last_update(run_id)} of {plan.schedule.updates}"
            reason += weights_hint(run_id, reason)
        print(f"[gradshare] arm {arm}: the full chain of errors is in the run's failure/details.txt",
              file=sys.stderr, flush=True)
        raise StudyError(reason)


def trained_whole(workdir: Path) -> bool:
    """Rank 0 wrote the arm's result (every update, the checkpoint and its hash) and no rank a
    reason of its own (a store that refused the checkpoint, a replica mismatch)."""
    return (workdir / workdir_files.SUMMARY).exists() and not failures.rank_reasons(workdir)
