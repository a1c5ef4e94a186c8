"""An arm is one row of `arms.rows`: its name, kind, processes and its own PowerSGD settings. Code
outside the plan asks the row (`Plan.arm`) and never compares an arm's name with a literal."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gradshare.kinds import table
from gradshare.contract.plan import PlanError, load_plan
from gradshare.cost.volume import exchange_bytes
from gradshare.kinds.powersgd import compressed_elements
from gradshare.model.source import parameter_shapes

REPO = Path(__file__).resolve().parents[3]
THREE = "single:single:1,dense:dense:2,powersgd:powersgd:2"
FOUR = THREE + ",powersgd8:powersgd:2:rank=8"


def test_a_fourth_arm_is_one_row_with_its_own_rank_and_the_plans_warm_up():
    plan = load_plan("tiny", {"arms.rows": FOUR})
    assert plan.arms.names == ("single", "dense", "powersgd", "powersgd8")
    p8 = plan.arm("powersgd8")
    assert (p8.kind, p8.processes, p8.rank, p8.warmup_updates) == ("powersgd", 2, 8, plan.powersgd.warmup_updates)
    assert plan.arm("powersgd").rank == plan.powersgd.rank == 32  # the row without its own rank
    assert p8.is_ddp and p8.method is table.of("powersgd")
    assert [a.name for a in plan.arm_list()] == list(plan.arms.names)
    own = load_plan("tiny", {"arms.rows": THREE + ",late:powersgd:2:rank=4:warmup=20"}).arm("late")
    assert (own.rank, own.warmup_updates) == (4, 20)
    assert [own.compresses(u) for u in (20, 21)] == [False, True]
    assert load_plan("tiny").arms.rows == tuple(THREE.split(","))  # the study's own three arms


def test_each_arm_exchanges_at_its_own_rank():
    plan = load_plan("tiny", {"arms.rows": FOUR})
    shapes = parameter_shapes(plan)
    b = exchange_bytes(plan, shapes)
    at8 = 4 * compressed_elements(shapes, 8, plan.powersgd.min_compression_rate)
    at32 = 4 * compressed_elements(shapes, 32, plan.powersgd.min_compression_rate)
    assert at8 < at32 < b.dense
    last = plan.schedule.updates
    assert b.of(plan.arm("powersgd8"), last) == at8 and b.of(plan.arm("powersgd"), last) == at32
    warm = plan.powersgd.warmup_updates
    assert b.of(plan.arm("powersgd8"), warm) == b.dense  # its warm-up is a plain all-reduce
    assert b.of(plan.arm("single"), last) == 0


@pytest.mark.parametrize("rows, said", [
    ("single:single:2", "single is a single arm (one process that accumulates) but has 2 processes"),
    ("single:single:1,x:ddp:2", "kind 'ddp' is not one of single, dense, powersgd"),
    ("single:single:1,dense:dense:2:rank=4", "'rank=4' is not a setting of a dense arm (its settings: none)"),
    ("single:single:1,p:powersgd:2:rank=0", "p's rank=0 must be >= 1"),
    ("single:single:1,p:powersgd:2:warmup=1", "p's warmup_updates=1 must be >= 2"),
    ("single:single:1,p:powersgd:2:rank=x", "'rank=x' is not a setting of a powersgd arm (its settings: rank=N, warmup=N)"),
    ("single:single:1,two words:dense:2", "the name 'two words' must be letters, digits, - or _"),
    ("single:single:1,dense:dense", "is not name:kind:processes"),
    ("single:single:1,dense:dense:two", "processes 'two' is not a whole number"),
    ("single:single:1,single:single:1", "names an arm twice"),
    ("single:single:1,dense:dense:3", "dense's 3 processes (arms.rows)"),
], ids=["single on two", "unknown kind", "rank on dense", "rank 0", "warm-up 1", "rank not a number", "bad name",
        "no processes", "processes not a number", "a name twice", "documents do not split"])
def test_a_row_that_cannot_run_is_refused_naming_it(rows, said):
    with pytest.raises(PlanError) as e:
        load_plan("tiny", {"arms.rows": rows, "arms.candidate": "single", "arms.controls": "single"})
    assert said in str(e.value), str(e.value)


def test_the_candidate_controls_and_speed_baseline_must_be_rows():
    with pytest.raises(PlanError) as e:
        load_plan("tiny", {"arms.rows": "single:single:1,dense:dense:2"})
    msg = str(e.value)
    assert "arms.candidate='powersgd' is not an arm of arms.rows (single, dense)" in msg
    with pytest.raises(PlanError, match="not an arm of arms.rows"):
        load_plan("tiny", {"arms.rows": FOUR, "screen.speed_baseline": "powersgd4"})


def _name_comparisons(source: str) -> list[int]:
    """Lines of `x == "dense"`, `arm in ("single", ...)`, `arm != "powersgd"` in one module: a
    comparison of something with an arm kind's name as a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(x, ast.Constant) and x.value in table.names() for x in items):
                found.append(node.lineno)
    return found


def test_no_module_compares_a_kind_name_or_asks_for_powersgd_by_name():
    """Code asks an arm's kind (`Arm.method`) what it does; no module, the kinds' own included,
    compares a kind's name with a literal or asks a yes/no question about one kind
    (`has_powersgd`)."""
    modules = [p for d in ("gradshare", "analysis", "entrypoints", "scripts", "benchmarks")
               for p in (REPO / d).rglob("*.py")]
    assert len(modules) > 50
    compared = [f"{p.relative_to(REPO)}:{line}" for p in modules for line in _name_comparisons(p.read_text())]
    assert compared == []
    asked = [str(p.relative_to(REPO)) for p in modules if "has_powersgd" in p.read_text()]
    assert asked == []
    # the scan itself sees such a comparison where one is
    assert _name_comparisons('if arm.kind == "powersgd":\n    pass\nok = kind in ("single", "x")\n') == [1, 3]
