"""The link probe's decision before a two-host arm (`gradshare.train.link_check.verdict`), on the
tiny plan's bounds and figures worked out here: dense sends 5.77 MB a rank an update (the tiny
model's FP32 gradient, a ring of two); at 1 Mbit/s one update's exchange takes 48 s, past the
30 s hang bound, and the arm is refused naming the rate; at the plan's 22 Mbit/s, 2.2 s: not
refused; the whole arm past its updates' share of the time limit is refused too. (The probe on a
real 1 Mbit/s link, and the refusal it makes: tests/e2e/test_faults_round4.py.)"""
from __future__ import annotations

from gradshare.contract.plan import load_plan
from gradshare.cost.volume import WIRE_OVERHEAD
from gradshare.train import link_check
from tests.conftest import SMALL

DENSE = [5.77e6 * WIRE_OVERHEAD] * 8  # one rank's wire bytes at each of the 8 updates


def test_a_link_on_which_one_update_outlasts_the_hang_bound_is_refused_naming_the_rate():
    plan = load_plan("tiny", SMALL)
    assert plan.arms.hang_s() == 30 and plan.schedule.updates == 8
    why = link_check.verdict(plan, "dense", DENSE, 1e6 / 8)
    assert why.startswith("link: the link to the other host carries 1.00 Mbit/s (a probe before the arm); arm "
                          "dense's largest update sends 6.03 MB a rank, 48 s at that rate, past the 30 s"), why
    assert "no attempt used" in why
    assert link_check.verdict(plan, "dense", DENSE, 22e6 / 8) is None
    # at the bound exactly it is not refused: 30 s an update is still an update within 30 s (the
    # time limit out of the way: 8 x 2.5 s x 100 = 2,000 s for the updates)
    roomy = load_plan("tiny", {**SMALL, "arms.timeout_margin": "100"})
    assert link_check.verdict(roomy, "dense", DENSE, DENSE[0] / 30) is None
    assert "past the 30 s within which" in link_check.verdict(roomy, "dense", DENSE, DENSE[0] / 30.5)


def test_an_arm_whose_updates_outlast_their_share_of_the_time_limit_is_refused_with_the_figures():
    # the hang bound out of the way (1,000 updates' worth): 8 x 2.5 s x 4 = 80 s for the updates
    plan = load_plan("tiny", {**SMALL, "arms.hang_updates": "1000"})
    why = link_check.verdict(plan, "dense", DENSE, DENSE[0] / 12)  # 12 s an update: 96 s
    assert why.startswith("link: the link to the other host carries "), why
    assert "8 updates send 48.3 MB a rank, 96 s at that rate, past the 80 s its time limit gives its updates " \
           "(8 x arms.expected_update_s 2.5 x arms.timeout_margin 4)" in why, why
    assert link_check.verdict(plan, "dense", DENSE, DENSE[0] / 10) is None  # 80 s: within
    # one process, nothing crosses a link: nothing to refuse
    assert link_check.verdict(plan, "single", [0.0] * 8, 1.0) is None
