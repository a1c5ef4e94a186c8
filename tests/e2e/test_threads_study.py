"""Equal compute per device on CPU: every process of every arm runs with the plan's threads."""
import json

import pytest

from gradshare.contract.plan import load_plan
from gradshare.tracking import study_runs
from tests.conftest import SMALL

pytestmark = pytest.mark.e2e

ARMS = ("single", "dense", "powersgd")


def test_each_rank_of_each_arm_really_ran_with_one_thread(trained_study, tmp_path):
    prep = study_runs.prepare_run(trained_study)
    assert prep.data.params["hardware.threads_per_process"] == "1"
    manifest = json.loads(study_runs.download(prep.info.run_id, "inputs/manifest.json", tmp_path).read_text())
    assert manifest["threads_per_process"] == 1
    plan = load_plan("tiny", SMALL)
    for arm in ARMS:
        [run] = study_runs.search(trained_study, "train", arm, status="FINISHED")
        # gathered from every rank at the end of training: torch.get_num_threads() per rank
        assert run.data.params["torch_threads_per_rank"] == ",".join(["1"] * plan.arms.processes(arm)), arm
