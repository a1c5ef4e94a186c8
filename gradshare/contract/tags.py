"""Every `gradshare.*` tag a run carries, and the one MLflow tag gradshare sets on a study.

Steps find each other through these tags (a study's runs, a step's arm, the plan's hash), so
each name is written here once and imported wherever it is set or read.
"""
from __future__ import annotations

PREFIX = "gradshare."

# what a run is: the study, its step and arm, the plan it ran
STUDY = PREFIX + "study"
STEP = PREFIX + "step"
ARM = PREFIX + "arm"
PLAN_SHA = PREFIX + "plan_sha256"

# how it ended
FAILURE = PREFIX + "failure_reason"  # the one-line reason of a FAILED or refused (KILLED) run
REFUSAL = PREFIX + "refusal"  # "true": refused before any work, no attempt of anything
ATTEMPT = PREFIX + "attempt"  # a train run's attempt number for its arm
INTERRUPTED = PREFIX + "interrupted"  # "true": stopped from outside (SIGTERM, Ctrl-C); KILLED, no attempt used
CLAIM = PREFIX + "claim"  # the arm's claim that this run holds
RESUMED = PREFIX + "resumed_from_update"  # the updates a run was resumed after, comma-separated
RESUMED_RUN = PREFIX + "resumed_run"  # on a launcher's run: the train run it resumed
RESUMED_FULL_STATE_BYTES = PREFIX + "resumed_full_state_bytes"

# what it holds, by hash
CKPT_SHA = PREFIX + "checkpoint_sha256"  # the trained weights' content
COMMITTED = PREFIX + "committed"
COMMITMENT_VOID = PREFIX + "commitment_void"  # "true": a commit run that died holding a commitment.json
INPUTS_SHA = PREFIX + "inputs_sha256"  # prepare's: every input of the study
INPUT_SHA = PREFIX + "sha256"  # on one logged input dataset
SCHEDULE_SHA = PREFIX + "schedule_sha256"  # a train run's: the updates it trained, in order
SEED_MODEL = PREFIX + "seed_model"  # prepare's: what the seed model is (pre-trained, random, ...)

# the runs a step read
PREPARE_RUN = PREFIX + "prepare_run_id"
COMMIT_RUN = PREFIX + "commit_run_id"

# the process behind a run (a sweep ends runs nobody is behind any more)
PID = PREFIX + "pid"
PID_STARTED = PREFIX + "pid_started"
HOST_ID = PREFIX + "host_id"

# notes for the reader
REHEARSAL = PREFIX + "rehearsal"  # on train and commit runs of a study rehearsed on one GPU
DEVICE_NOTE = PREFIX + "device_note"  # prepare's: the arms need GPUs this machine lacks
PRICE_WARNING = PREFIX + "price_warning"
GUARD = PREFIX + "guard"  # the guard's: which instances it stopped, and in what state


def screen_tag(name: str) -> str:
    """The analyze run's verdict word of one screen (`quality_screen`, `speed_screen`)."""
    return PREFIX + name


EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow 3's UI: model training, not GenAI
RUN_NAME = "mlflow.runName"  # MLflow's name of a run: its row in the runs table says what it is
SOCKETS_BEST = PREFIX + "sockets_best"  # the preflight's fastest socket setting (`hardware.sockets=auto`)
NOTE = "mlflow.note.content"  # MLflow's description of a run or an experiment (markdown), shown first
