"""One update of an arm's own loop, profiled on request (`GRADSHARE_PROFILE_UPDATE`): exactly that
update, its host and device totals and the ops' table; a bad value is refused naming the switch."""
from __future__ import annotations

import pytest
import torch

from gradshare.contract.plan import load_plan
from gradshare.model.lm import build_model
from gradshare.model.source import model_config
from gradshare.train import profiling
from gradshare.train.loop import TrainJob, train
from tests.unit.train.test_micro_batches import SMALL, _inputs


def test_the_update_asked_for_is_profiled_and_no_other(tmp_path):
    docs, tok, schedule = _inputs(tmp_path)
    plan = load_plan("tiny", SMALL)
    model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
    request = profiling.from_env(tmp_path, 0, {profiling.ENV: "3"})
    assert request == profiling.ProfileRequest(3, tmp_path / "profile.rank0.txt")
    started = []
    real = torch.profiler.profile.__enter__
    monkey = pytest.MonkeyPatch()
    monkey.setattr(torch.profiler.profile, "__enter__", lambda self: (started.append(1), real(self))[1])
    try:
        res = train(TrainJob(plan, "single", model, tok, docs, schedule, torch.device("cpu"), 0, 1, log=lambda *a: None,
                    profile=request))
    finally:
        monkey.undo()
    assert len(res.losses) == 4 and started == [1]
    table = request.out.read_text()
    assert table.startswith("update 3: host self time ") and "aten::" in table


def test_no_switch_no_profile_and_a_bad_one_is_refused(tmp_path):
    assert profiling.from_env(tmp_path, 0, {}) is None
    with pytest.raises(ValueError, match="GRADSHARE_PROFILE_UPDATE='x' must be an update number"):
        profiling.from_env(tmp_path, 0, {profiling.ENV: "x"})
