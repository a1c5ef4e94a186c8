"""The table of arm kinds (`gradshare.kinds`): an unknown kind is refused by name wherever one
could enter (a row at prepare, an `Arm` made by hand, every `cost/` function that takes an arm),
never taken for dense; each kind's bytes, words and cost parts come from the kind."""
from __future__ import annotations

import dataclasses

import pytest

from gradshare.contract.arms_plan import Arm
from gradshare.contract.errors import PlanError
from gradshare.contract.plan import load_plan
from gradshare.cost import gpu_cost, link, limits, measured, volume
from gradshare.cost import projection as P
from gradshare.kinds import table
from gradshare.kinds.base import UnknownKind, gradient_elements
from gradshare.model.source import parameter_shapes

KNOWN = ", ".join(table.names())
SAID = f"kind 'topk' is not one of {KNOWN}"


def test_the_table_names_each_kind_once_by_its_own_name():
    assert table.names()[:3] == ("single", "dense", "powersgd")
    assert all(table.of(name).name == name for name in table.names())
    with pytest.raises(UnknownKind, match=SAID):
        table.of("topk")


def test_an_unknown_kind_is_refused_by_name_at_prepare_and_in_an_arm_made_by_hand():
    with pytest.raises(PlanError, match=SAID):
        load_plan("tiny", {"arms.rows": "single:single:1,t:topk:2", "arms.candidate": "single",
                           "arms.controls": "single"})
    with pytest.raises(UnknownKind, match=SAID):
        Arm("t", "topk", 2)  # never taken for DDP, as `kind != "single"` once took it


def _bad_plan():
    """The tiny plan with a `topk` row slipped past `load_plan`'s checks (`dataclasses.replace`)."""
    plan = load_plan("tiny")
    return dataclasses.replace(plan, arms=dataclasses.replace(plan.arms, rows=plan.arms.rows + ("t:topk:2",)))


def _bad_arm():
    """An `Arm` whose kind is unknown, made without its own check, as code that skipped it would."""
    arm = object.__new__(Arm)
    for k, v in {"name": "t", "kind": "topk", "processes": 2, "rank": 0, "warmup_updates": 0}.items():
        object.__setattr__(arm, k, v)
    return arm


def _calibration():
    gpu = gpu_cost.GpuRates("g", matmul_tflops=800.0, memory_gbps=4000.0, pinned_both_gbps=100.0, source="-")
    return gpu_cost.Calibration(gpu=gpu, s_per_padded_token=20e-6, s_per_micro_batch=0.005, s_fixed=0.02,
                                dense_extra_s=0.01, compress_s=0.03, error_bytes=6e9, source="by hand", checks={})


FIGURES = {"best": "1", "world": 2, "settings": {"1": {"dense_round_bytes": 1e6, "dense_last_Bps": 1e6,
                                                     "dense_first_Bps": 1e6, "powersgd_round_s": 0.1}}}
SHAPES = [(64, 32), (32,)]
TAKES_AN_ARM = {
    "volume.exchange_bytes": lambda plan, arm: volume.exchange_bytes(plan, SHAPES),
    "volume.ExchangeBytes.of": lambda plan, arm: volume.exchange_bytes(load_plan("tiny"), SHAPES).of(arm, 1),
    "volume.arm_cross_zone_bytes": lambda plan, arm: volume.arm_cross_zone_bytes(
        plan, "t", volume.exchange_bytes(load_plan("tiny"), SHAPES)),
    "gpu_cost.Calibration.parts": lambda plan, arm: _calibration().parts(arm, load_plan("tiny"), 2048, 1),
    "gpu_cost.Calibration.seconds": lambda plan, arm: _calibration().seconds(arm, load_plan("tiny"), 2048, 1, 9),
    "measured.update_s": lambda plan, arm: measured.update_s(plan, "t", 9, 1.0, FIGURES),
    "measured.arm_seconds": lambda plan, arm: measured.arm_seconds(plan, "t", 1.0, FIGURES),
    "limits.expected_cross_bytes": lambda plan, arm: limits.expected_cross_bytes(plan, "t", SHAPES),
    "link.from_measurements": lambda plan, arm: link.from_measurements(
        plan, {"single": {"step_s": [(3, 1.0)], "logical_bytes": [(3, 0)]}, "t": {}}, "m"),
    "projection.Hosts.update_s": lambda plan, arm: P.Hosts.update_s(
        type("H", (), {"plan": plan, "cost": _calibration()})(), "t", 9, {}, 2, 1e3),
}


@pytest.mark.parametrize("call", list(TAKES_AN_ARM.values()), ids=list(TAKES_AN_ARM))
def test_every_cost_function_that_takes_an_arm_refuses_an_unknown_kind_by_name(call):
    with pytest.raises((PlanError, UnknownKind), match=SAID):
        call(_bad_plan(), _bad_arm())


def test_each_kind_counts_its_own_bytes_per_update():
    plan = load_plan("tiny", {"arms.rows": "single:single:1,dense:dense:2,powersgd:powersgd:2,fp16:fp16:2"})
    shapes = parameter_shapes(plan)
    b = volume.exchange_bytes(plan, shapes)
    fp32 = 4 * gradient_elements(shapes)
    warm, last = plan.powersgd.warmup_updates, plan.schedule.updates
    assert [b.of(plan.arm("single"), u) for u in (1, last)] == [0, 0]
    assert [b.of(plan.arm("dense"), u) for u in (1, last)] == [fp32, fp32]
    assert [b.of(plan.arm("fp16"), u) for u in (1, last)] == [fp32 // 2, fp32 // 2]  # two bytes an element
    assert b.of(plan.arm("powersgd"), warm) == fp32 and b.of(plan.arm("powersgd"), warm + 1) == b.compressed < fp32
    # its words in STUDY.md's table and the report come from the kind too
    assert plan.arm("powersgd").method.describe(plan.arm("powersgd")).endswith(f", rank {plan.powersgd.rank}")
    assert "fp16_compress_hook" in plan.arm("fp16").method.describe(plan.arm("fp16"))


def test_each_kind_adds_its_own_part_to_an_updates_cost():
    plan = load_plan("tiny", {"arms.rows": "single:single:1,dense:dense:2,powersgd:powersgd:2,fp16:fp16:2"})
    c = _calibration()
    base = {"matrix", "micro_batches", "fixed"}
    assert set(c.parts(plan.arm("single"), plan, 2048, 1)) == base
    assert set(c.parts(plan.arm("dense"), plan, 2048, 1)) == base | {"dense_extra"}
    assert c.parts(plan.arm("fp16"), plan, 2048, 1) == c.parts(plan.arm("dense"), plan, 2048, 1)
    assert set(c.parts(plan.arm("powersgd"), plan, 2048, 1)) == base | {"dense_extra", "compress",
                                                                         "error_copies_exposed"}
    # the measured link: fp16 sends half of dense's round, PowerSGD its own once it compresses
    warm = plan.powersgd.warmup_updates
    rounds = {"dense": measured.update_s(plan, "dense", 9, 1.0, FIGURES) - 0.5}
    assert rounds["dense"] == pytest.approx(1.0)  # 1 MB at 1 MB/s, half of the 1 s compute on each rank
    assert measured.update_s(plan, "fp16", 9, 1.0, FIGURES) == pytest.approx(0.5 + 0.5)
    assert measured.update_s(plan, "powersgd", warm, 1.0, FIGURES) == pytest.approx(0.5 + 1.0)
    assert measured.update_s(plan, "powersgd", warm + 1, 1.0, FIGURES) == pytest.approx(0.5 + 0.1)
