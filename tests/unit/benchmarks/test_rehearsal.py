"""The one-GPU rehearsal's script (`benchmarks/rehearsal.py`), the parts a CPU can check: a cut
to N updates is a valid plan whose data fill exactly N updates and whose PowerSGD arm still
compresses; the commit recorded is this checkout's own, never an enclosing repository's; the
table puts the production single beside the harness and checks the arms' losses."""
from __future__ import annotations

import subprocess

import pytest

from benchmarks import rehearsal
from gradshare.contract.plan import load_plan


@pytest.mark.parametrize("updates", [3, 4, 16, 64])
def test_a_rehearsal_cut_to_n_updates_is_a_plan_whose_data_fill_them_and_powersgd_compresses(updates):
    plan = load_plan("full", rehearsal._overrides(False, [], updates))
    assert plan.schedule.updates == updates
    assert plan.train_docs == updates * plan.schedule.docs_per_update  # every document used once
    assert 2 <= plan.powersgd.warmup_updates < updates
    assert plan.hardware.rehearsal == "one-gpu"
    full = load_plan("full", rehearsal._overrides(False, []))  # no --updates: the plan's own
    assert (full.schedule.updates, full.train_docs, full.powersgd.warmup_updates) == (128, 4096, 8)
    with pytest.raises(SystemExit, match="at least 3"):
        rehearsal.cut_to(2)


def test_the_commit_is_this_checkouts_own_never_an_enclosing_ones(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    (outer / "a.txt").write_text("a")
    subprocess.run(git + ["init", "-q"], cwd=outer, check=True)
    subprocess.run(git + ["add", "."], cwd=outer, check=True)
    subprocess.run(git + ["commit", "-qm", "outer"], cwd=outer, check=True)
    assert rehearsal.own_commit(outer / "inner").startswith("unknown")  # a copy inside another checkout
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=outer, capture_output=True,
                          text=True).stdout.strip()
    assert rehearsal.own_commit(outer) == head
    (outer / "a.txt").write_text("changed")
    assert rehearsal.own_commit(outer) == head + "-dirty"


def test_the_median_is_over_the_steady_updates():
    assert rehearsal.median_steady([(1, 9.0), (2, 5.0), (3, 4.0), (4, 0.2), (5, 0.1), (6, 0.3)]) == 0.2
    assert rehearsal.median_steady([(1, 2.0), (2, 1.0)]) == 1.5  # shorter than 4 updates: all of them
    assert rehearsal.median_steady([]) is None


def test_the_table_sets_the_production_single_beside_the_harness_and_compares_losses():
    arm = {"status": "FINISHED", "phases_s": {"setup": 10.0}, "median_step_s": 0.15, "updates": 128,
           "peaks_gib": {0: (25.7, 35.3)}, "ckpt_bytes": 6.8e9, "replica_tensors": 311, "warmup_updates": 0,
           "processes": 1,
           "losses": [2.0, 1.5, 1.0]}
    data = {"env": {"date": "2026-12-06", "device": "NVIDIA H200", "torch": "2.11", "transformers": "5.17",
                    "commit": "abc1234"}, "overrides": {}, "updates": None, "steps": {"prepare": {"s": 20, "rc": 0}},
            "whole_s": 900, "harness": {"step_s": 0.137, "updates": 128, "commit": "abc1234", "peak_reserved_gib": 35.3},
            "arms": {"single": arm,
                     "dense": arm | {"losses": [2.0, 1.503, 1.0], "peaks_gib": {0: (28, 35.2), 1: (28, 35.2)}, "processes": 2},
                     "powersgd": arm | {"warmup_updates": 2, "losses": [2.0, 1.503, 0.9], "processes": 2}},
            "scored": {"seed": {"load_s": 1, "test_s": 5, "retention_s": 1}}}
    md = rehearsal.markdown(data)
    assert "the plan's length and data" in md and "commit abc1234" in md
    assert "0.150 s/update against 0.137 (1.09x" in md
    assert "dense vs single over updates 1..3: 2.0e-03" in md
    assert "powersgd vs dense over updates 1..2: 0.0e+00" in md  # its warm-up only
    assert "| dense | FINISHED | 128 |" in md and "311 tensors agree" in md
    assert "| single | FINISHED | 128 |" in md and "| - | 6,800,000,000 |" in md  # one rank: no replicas
