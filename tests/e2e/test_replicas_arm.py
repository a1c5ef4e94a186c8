"""Replicas agree, checked, through the train entry point: a perturbed rank 1
(`GRADSHARE_INJECT_PERTURB_RANK`) ends the arm FAILED naming the tensor. (The fingerprint and
the check on two real gloo ranks: tests/unit/train/test_replicas.py.)"""
from __future__ import annotations

import pytest

from gradshare.contract import metrics as M
from gradshare.contract.tags import CKPT_SHA, FAILURE
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import overrides, run_entry

pytestmark = pytest.mark.e2e


def test_a_perturbed_replica_ends_the_arm_failed_naming_the_tensor(mlflow_server):
    study = "replica-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}))
    proc = run_entry("train", "--study", study, "--arm", "powersgd", check=False,
                     env={"GRADSHARE_INJECT_PERTURB_RANK": "1"})
    assert proc.returncode != 0
    [run] = study_runs.search(study, "train", "powersgd", status="FAILED")
    reason = run.data.tags[FAILURE]
    assert reason.startswith("replicas disagree: rank 1's weights differ from rank 0's at tensor "), reason
    assert "lm_head.weight" in reason or "norm.weight" in reason, reason  # the model's last parameter
    assert len(connection.client().get_metric_history(run.info.run_id, M.STEP_S)) == 8  # every update trained
    assert CKPT_SHA not in run.data.tags  # nothing is recorded as the arm's result
