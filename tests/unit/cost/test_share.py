"""One rank's share of an update (`gradshare.cost.share`): the preflight's measured figure where it
timed as many ranks as the arm has, a rank's documents where it did not, the whole for a
one-process arm; and the measured figure is the one the go/no-go's seconds are made of."""
from __future__ import annotations

import pytest

from gradshare.contract.plan import load_plan
from gradshare.cost import measured
from gradshare.cost.share import compute_share, work_share
from gradshare.tracking.figures import FinishedRun, StudyFigures

PLAN = load_plan("tiny", {"schedule.updates": "8", "schedule.docs_per_update": "8", "data.train_per_family": "12",
                          "data.replay_docs": "16", "powersgd.warmup_updates": "2"})


def studied(plan, single_s: float, shapes=((64, 64),)) -> StudyFigures:
    """A study whose single arm finished, every update taking `single_s` (one device's whole update),
    started at epoch 0 with nothing spent: what the go/no-go reads of it."""
    single = FinishedRun("s1", "single", {}, {}, ((1, single_s), (2, single_s)))
    return StudyFigures(start_epoch=0.0, finished={a: (single,) if a == "single" else () for a in plan.arms.names},
                        attempts=(), shapes=tuple(shapes), preflight=None)


def _figures(compute: dict | None, world: int = 2) -> dict:
    setting = {"dense_Bps": 4e6, "dense_first_Bps": 4e6, "dense_last_Bps": 4e6, "dense_round_s": 0.25,
               "dense_round_bytes": 1e6, "capacity_Bps": 4e6, "powersgd_round_s": 0.01}
    return {"settings": {"4x1": setting}, "best": "4x1", "world": world, "clock_offset_s": [0.0] * world,
            "ranks": [], "backend": "gloo", **({"compute": compute} if compute is not None else {})}


def test_a_measured_share_replaces_the_documents_share_only_for_as_many_ranks_as_were_timed():
    timed = {"share": 0.93, "alone_s": 0.2, "rank_s": 0.186, "source": "timed"}
    assert compute_share(PLAN, "dense", _figures(timed))[0] == 0.93
    assert compute_share(PLAN, "powersgd", _figures(timed))[0] == 0.93
    assert compute_share(PLAN, "single", _figures(timed)) == (1.0, "one process: the whole update")
    assert compute_share(PLAN, "dense", _figures(timed, world=4))[0] == 0.5  # timed with 4 ranks, not 2
    assert compute_share(PLAN, "dense", _figures({}))[0] == 0.5
    assert compute_share(PLAN, "dense", None)[0] == 0.5
    assert work_share(2) == 0.5 and work_share(1) == 1.0
    with pytest.raises(ValueError, match="at least one process"):
        work_share(0)


def test_the_go_no_go_seconds_are_compute_times_the_measured_share_plus_the_round():
    f = _figures({"share": 0.9, "alone_s": 0.3, "rank_s": 0.27, "source": "timed"})
    compute = 0.2
    # dense: 8 x (0.2 x 0.9 + 0.25); powersgd: 2 warm-up updates as dense, 6 at PowerSGD's 0.01
    assert measured.arm_seconds(PLAN, "dense", compute, f) == pytest.approx(8 * (0.18 + 0.25))
    assert measured.arm_seconds(PLAN, "powersgd", compute, f) == pytest.approx(2 * 0.43 + 6 * 0.19)
    assert measured.arm_seconds(PLAN, "single", compute, f) == pytest.approx(8 * 0.2)
    f["run_id"] = "r1"
    g = measured.go_no_go(PLAN, f, studied(PLAN, compute), 10.0, now=100.0, spent_usd=0.0)
    assert {r["arm"]: r["seconds"] for r in g["arms"]} == pytest.approx({"dense": 10 + 8 * 0.43,
                                                                        "powersgd": 10 + 2 * 0.43 + 6 * 0.19})


def test_the_preflight_keeps_rank_0s_timing_from_the_setting_that_made_it_and_logs_it():
    def result(compute):
        return {"backend": "gloo", "world": 2, "clock_offset_s": [0.0, 0.0], "compute": compute,
                "ranks": [{"rank": 0, "resources": {"host": "a", "host_available_bytes": 1e9,
                                                    "outbox_free_bytes": 1e9}, "host_link": {}}],
                "link": {"dense": {"logical_Bps": 1e6, "first_window_Bps": 1e6, "last_window_Bps": 1e6,
                                   "round_s_median": 1.0, "bytes_per_round": 1e6},
                         "capacity": {"logical_Bps": 1e6}}}
    timed = {"share": 0.81, "alone_s": 0.4, "rank_s": 0.324, "source": "timed"}
    figures = measured.summarize(PLAN, {"1x1": result(timed), "4x1": result({})})
    assert figures["compute"] == timed
    m = measured.metrics(figures)
    assert (m["preflight/compute_share"], m["preflight/compute_alone_s"], m["preflight/compute_rank_s"]) == (
        0.81, 0.4, 0.324)
