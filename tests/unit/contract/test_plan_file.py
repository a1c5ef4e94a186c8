"""plan.json: one writer, one reader that verifies the hash it carries; `Arm`: the questions
the code asks of an arm instead of testing its name."""
from __future__ import annotations

import hashlib
import json

import pytest

from gradshare.contract.plan import PlanError, load_plan, plan_from_json, plan_json
from gradshare.train import workdir


def test_plan_json_carries_the_hash_of_its_fields_and_reads_back_to_the_same_plan():
    plan = load_plan("smoke", {"schedule.updates": "8"})
    text = plan_json(plan)
    raw = json.loads(text)
    fields = {k: v for k, v in raw.items() if k != "plan_sha256"}
    # the hash, recomputed here from the fields as canonical JSON
    assert raw["plan_sha256"] == hashlib.sha256(
        json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()
    assert plan_from_json(text) == plan
    assert plan_from_json(text).sha256() == plan.sha256()


@pytest.mark.parametrize("change", ["a field", "the hash", "no hash"])
def test_a_changed_plan_json_is_refused_naming_where_it_came_from(change):
    raw = json.loads(plan_json(load_plan("smoke")))
    if change == "a field":
        raw["schedule"]["updates"] += 1
    elif change == "the hash":
        raw["plan_sha256"] = "0" * 64
    else:
        del raw["plan_sha256"]
    with pytest.raises(PlanError, match="the-file-it-was does not hash to the plan_sha256 it carries"):
        plan_from_json(json.dumps(raw), "the-file-it-was")


def test_the_worker_reads_the_plan_the_driver_wrote_and_refuses_one_changed_since(tmp_path):
    plan = load_plan("smoke")
    workdir.write_plan(tmp_path, plan)
    assert workdir.read_plan(tmp_path) == plan
    path = tmp_path / "plan.json"
    raw = json.loads(path.read_text())
    raw["optim"]["lr"] *= 2  # a plan that would run, only not the one registered
    path.write_text(json.dumps(raw))
    # the machine's fault, not the method's: a refusal naming the file (no attempt used)
    with pytest.raises(workdir.WorkdirChanged, match=rf"^workdir: {path} changed after the arm's launch "
                                                      rf"\(PlanError: {path} does not hash"):
        workdir.read_plan(tmp_path)


def test_each_arm_answers_what_it_exchanges_and_when():
    plan = load_plan("tiny")
    warm = plan.powersgd.warmup_updates
    single, dense, powersgd = (plan.arm(a) for a in ("single", "dense", "powersgd"))
    assert (single.is_ddp, dense.is_ddp, powersgd.is_ddp) == (False, True, True)
    assert [a.method.compresses_gradient for a in (single, dense, powersgd)] == [False, False, True]
    assert [powersgd.compresses(u) for u in (1, warm, warm + 1, plan.schedule.updates)] == [False, False, True, True]
    assert not any(dense.compresses(u) or single.compresses(u) for u in range(1, plan.schedule.updates + 1))
    assert (single.processes, dense.processes, powersgd.processes) == (1, 2, 2)
    with pytest.raises(PlanError, match=r"arm 'dense2' is not in the plan's arms.rows \(single, dense, powersgd\)"):
        plan.arm("dense2")
