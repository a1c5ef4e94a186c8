"""Fault injection for the failure-path tests: every switch is read here, nowhere else.

    GRADSHARE_INJECT_NAN_AT=U     the loss of update U (1-based) is NaN on every rank,
                                  so the run must end FAILED as diverged
    GRADSHARE_INJECT_HANG_AT=U:R  rank R sleeps for ever at the start of update U, so the
                                  other ranks must time out rather than wait for ever
    GRADSHARE_INJECT_KILL_AT=U:R  rank R is killed (SIGKILL, no cleanup) at the start of update U
    GRADSHARE_INJECT_SLOW_S=S     every update takes S seconds longer (rank 0 sleeps inside
                                  the update's clock), so that deadlines and budgets are reached
    GRADSHARE_INJECT_PERTURB_RANK=R   after the last update, rank R adds 1e-3 to one weight of
                                  its replica, so that the replicas' check must fail the arm
    GRADSHARE_INJECT_KILL_LAUNCHER=1  once rank 0 has written the final checkpoint, the train step
                                  that launched the workers is killed (SIGKILL): the workers
                                  must record the arm without it
    GRADSHARE_INJECT_STOP_AT=U:R  rank R stops itself (SIGSTOP) at the start of update U: a frozen
                                  process, which the train step must name within arms.stall_s
    GRADSHARE_INJECT_KILL_AGENT_AT=U  rank 0 kills the launcher that started it (`accelerate
                                  launch`, SIGKILL) at the start of update U: its workers go on,
                                  watched by the train step, and the arm completes
    GRADSHARE_INJECT_KILL_AFTER_CHECKPOINT=R  rank R is killed (SIGKILL) once rank 0 has written
                                  the final checkpoint: the arm is FINISHED all the same
    GRADSHARE_INJECT_STOP_AFTER_RESULT=R  rank R stops itself (SIGSTOP) before the last barrier,
                                  once rank 0 has written the arm's result: a rank hung in
                                  teardown, which the train step stops; the arm is FINISHED
    GRADSHARE_INJECT_CORRUPT=FILE every rank overwrites FILE of the arm's working directory (e.g.
                                  plan.json) as it starts, after the train step verified it: a
                                  refusal naming the file, no attempt used
    GRADSHARE_INJECT_KILL_AFTER_COMMITMENT=1  the commit step kills itself (SIGKILL) once its
                                  commitment.json is stored: the next step voids it

Unset or empty: no fault. The training loop calls `update_start` and `loss` each update.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from gradshare.train.env import DRIVER_PID_ENV


NAN_ENV = "GRADSHARE_INJECT_NAN_AT"
HANG_ENV = "GRADSHARE_INJECT_HANG_AT"
SLOW_ENV = "GRADSHARE_INJECT_SLOW_S"
KILL_ENV = "GRADSHARE_INJECT_KILL_AT"
KILL_LAUNCHER_ENV = "GRADSHARE_INJECT_KILL_LAUNCHER"
PERTURB_ENV = "GRADSHARE_INJECT_PERTURB_RANK"
STOP_ENV = "GRADSHARE_INJECT_STOP_AT"
KILL_AGENT_ENV = "GRADSHARE_INJECT_KILL_AGENT_AT"
KILL_AFTER_CKPT_ENV = "GRADSHARE_INJECT_KILL_AFTER_CHECKPOINT"
CORRUPT_ENV = "GRADSHARE_INJECT_CORRUPT"
STOP_AFTER_RESULT_ENV = "GRADSHARE_INJECT_STOP_AFTER_RESULT"
KILL_AFTER_COMMITMENT_ENV = "GRADSHARE_INJECT_KILL_AFTER_COMMITMENT"
RESULT_WAIT_S = 120.0  # how long a rank other than 0 waits for rank 0's result before it stops


@dataclass(frozen=True)
class Faults:
    nan_at: int = 0  # update; 0: never
    hang_at: int = 0
    hang_rank: int = 0
    slow_s: float = 0.0
    kill_at: int = 0
    kill_rank: int = 0
    kill_launcher: bool = False
    perturb_rank: int = -1  # -1: none
    stop_at: int = 0
    stop_rank: int = 0
    kill_agent_at: int = 0
    kill_after_checkpoint_rank: int = -1  # -1: none
    corrupt: str = ""  # a file of the working directory; "": none
    stop_after_result_rank: int = -1  # -1: none

    def after_training(self, model, rank: int) -> None:
        if self.perturb_rank == rank:
            import torch

            name, p = list(model.named_parameters())[-1]
            with torch.no_grad():
                p.view(-1)[0] += 1e-3
            print(f"[gradshare] fault injection ({PERTURB_ENV}): rank {rank} perturbed {name}", flush=True)

    def at_start(self, workdir, rank: int) -> None:
        """Every rank, first thing: the working directory as a faulty machine might leave it."""
        if self.corrupt:
            print(f"[gradshare] fault injection ({CORRUPT_ENV}): rank {rank} overwrote {self.corrupt}", flush=True)
            (workdir / self.corrupt).write_text('{"not": "what the train step verified"')

    def checkpoint_written(self, rank: int) -> None:
        """Every rank, once rank 0 has written the final checkpoint."""
        if self.kill_after_checkpoint_rank == rank:
            print(f"[gradshare] fault injection ({KILL_AFTER_CKPT_ENV}): rank {rank} killed after the checkpoint",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def before_last_barrier(self, rank: int, result_written, sleep=time.sleep,
                            stop=lambda: os.kill(os.getpid(), signal.SIGSTOP)) -> None:
        """Every rank, before the arm's last barrier. `result_written()`: whether rank 0's result
        file exists; a rank other than 0 waits for it, so that the stop is in teardown, not before
        the result (the ranks share the working directory where this fault is injected)."""
        if self.stop_after_result_rank != rank:
            return
        waited = 0.0
        while not result_written() and waited < RESULT_WAIT_S:
            sleep(0.2)
            waited += 0.2
        print(f"[gradshare] fault injection ({STOP_AFTER_RESULT_ENV}): rank {rank} stopped before the last barrier",
              flush=True)
        stop()

    def after_checkpoint(self) -> None:
        if self.kill_launcher:
            pid = int(os.environ[DRIVER_PID_ENV])
            print(f"[gradshare] fault injection ({KILL_LAUNCHER_ENV}): the launcher (pid {pid}) killed",
                  flush=True)
            os.kill(pid, signal.SIGKILL)

    def during_update(self, rank: int, sleep=time.sleep) -> None:
        if self.slow_s and rank == 0:
            sleep(self.slow_s)

    def update_start(self, update: int, rank: int, sleep=time.sleep) -> None:
        if self.stop_at and update == self.stop_at and rank == self.stop_rank:
            print(f"[gradshare] fault injection ({STOP_ENV}): rank {rank} stopped at update {update}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kill_agent_at and update == self.kill_agent_at and rank == 0:
            print(f"[gradshare] fault injection ({KILL_AGENT_ENV}): the launcher (pid {os.getppid()}) killed at "
                  f"update {update}", flush=True)
            os.kill(os.getppid(), signal.SIGKILL)
        if self.kill_at and update == self.kill_at and rank == self.kill_rank:
            print(f"[gradshare] fault injection ({KILL_ENV}): rank {rank} killed at update {update}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hang_at and update == self.hang_at and rank == self.hang_rank:
            # every rank prints this, not only rank 0: the log must say which rank went quiet
            print(f"[gradshare] fault injection ({HANG_ENV}): rank {rank} hangs at update {update}",
                  flush=True)
            while True:  # a hang, not an exit: the process stays alive and silent
                sleep(3600)

    def loss(self, update: int, loss: float) -> float:
        return float("nan") if self.nan_at and update == self.nan_at else loss


def from_env(env=None) -> Faults:
    env = os.environ if env is None else env
    nan = env.get(NAN_ENV, "").strip()
    hang = env.get(HANG_ENV, "").strip()
    slow = env.get(SLOW_ENV, "").strip()
    kill = env.get(KILL_ENV, "").strip()
    try:
        kill_at, kill_rank = (int(x) for x in kill.split(":")) if kill else (0, 0)
        nan_at = int(nan) if nan else 0
        hang_at, hang_rank = (int(x) for x in hang.split(":")) if hang else (0, 0)
        slow_s = float(slow) if slow else 0.0
    except ValueError:
        raise ValueError(f"fault injection: {NAN_ENV}={nan!r} must be an update number, "
                         f"{HANG_ENV}={hang!r} and {KILL_ENV}={kill!r} must be UPDATE:RANK (e.g. 3:1) and "
                         f"{SLOW_ENV}={slow!r} "
                         f"seconds; unset them to train without faults") from None
    stop = env.get(STOP_ENV, "").strip()
    agent = env.get(KILL_AGENT_ENV, "").strip()
    after_ckpt = env.get(KILL_AFTER_CKPT_ENV, "").strip()
    after_result = env.get(STOP_AFTER_RESULT_ENV, "").strip()
    try:
        stop_at, stop_rank = (int(x) for x in stop.split(":")) if stop else (0, 0)
        kill_agent_at = int(agent) if agent else 0
        kill_after_checkpoint_rank = int(after_ckpt) if after_ckpt else -1
        stop_after_result_rank = int(after_result) if after_result else -1
    except ValueError:
        raise ValueError(f"fault injection: {STOP_ENV}={stop!r} must be UPDATE:RANK, {KILL_AGENT_ENV}={agent!r} an "
                         f"update, {KILL_AFTER_CKPT_ENV}={after_ckpt!r} and {STOP_AFTER_RESULT_ENV}={after_result!r} "
                         f"a rank; unset them to train without faults") from None
    launcher = env.get(KILL_LAUNCHER_ENV, "").strip().lower() in ("1", "true", "yes")
    perturb = env.get(PERTURB_ENV, "").strip()
    try:
        perturb_rank = int(perturb) if perturb else -1
    except ValueError:
        raise ValueError(f"fault injection: {PERTURB_ENV}={perturb!r} must be a rank (e.g. 1)") from None
    return Faults(nan_at, hang_at, hang_rank, slow_s, kill_at, kill_rank, launcher, perturb_rank, stop_at, stop_rank,
                  kill_agent_at, kill_after_checkpoint_rank, env.get(CORRUPT_ENV, "").strip(),
                  stop_after_result_rank)


def after_commitment() -> None:
    """The commit step, its commitment.json stored: killed here where the switch asks for it."""
    if os.environ.get(KILL_AFTER_COMMITMENT_ENV):
        os.kill(os.getpid(), signal.SIGKILL)
