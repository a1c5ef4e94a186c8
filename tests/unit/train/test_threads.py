"""Equal compute per device on CPU: every process of every arm is launched with the plan's
threads. (Each rank of a trained study really ran with them: tests/e2e/test_threads_study.py.)"""
from pathlib import Path

import pytest

from gradshare.contract.plan import PlanError, load_plan
from gradshare.train.launch import Launch, launch_command, thread_env
from tests.conftest import SMALL

ARMS = ("single", "dense", "powersgd")


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_every_arm_is_launched_with_the_plans_threads_per_process():
    plan = load_plan("tiny", SMALL)
    assert plan.hardware.threads_per_process == 1
    for arm in ARMS:
        cmd = launch_command(plan, arm, Path("/w"), "r", Launch())
        # before: `single` was given every core, a two-process arm one per process
        assert _flag(cmd, "--num_cpu_threads_per_process") == "1", arm
    assert thread_env(plan) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    three = load_plan("tiny", {**SMALL, "hardware.threads_per_process": "3"})
    assert all(_flag(launch_command(three, a, Path("/w"), "r", Launch()), "--num_cpu_threads_per_process") == "3"
               for a in ARMS)


def test_zero_threads_leaves_the_defaults_and_negative_is_refused():
    full = load_plan("full")
    assert full.hardware.threads_per_process == 0 and thread_env(full) == {}
    assert "--num_cpu_threads_per_process" not in launch_command(full, "dense", Path("/w"), "r", Launch())
    with pytest.raises(PlanError, match="threads_per_process"):
        load_plan("tiny", {"hardware.threads_per_process": "-1"})
