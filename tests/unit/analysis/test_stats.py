"""Tests for analysis.stats, checked against independent computations.

Reference values come from scipy/numpy or from small examples worked by hand,
never from the module under test, so a shared mistake cannot pass unnoticed.
"""

import math
import random

import numpy as np
import pytest
from scipy import stats as sps

from analysis.stats import (
    accuracy,
    accuracy_by_family,
    mcnemar_exact_p,
    paired_change,
    retention_change,
)

Z = 1.96


def _two_correlated_arms(n=1024, seed=20240607):
    """Two 0/1 arms that agree on most cases, as two fine-tunes of one seed do."""
    rng = np.random.default_rng(seed)
    base = rng.random(n) < 0.62
    flip_a = rng.random(n) < 0.08
    flip_b = rng.random(n) < 0.12
    a = (base ^ flip_a).astype(int)
    b = (base ^ flip_b).astype(int)
    ids = [f"case-{i:04d}" for i in range(n)]
    return dict(zip(ids, a.tolist())), dict(zip(ids, b.tolist())), a, b


def _pairs_from_counts(n00, n01, n10, n11):
    """Two arms with given cell counts; n01 = #(a=0, b=1), n10 = #(a=1, b=0)."""
    cells = [(0, 0)] * n00 + [(0, 1)] * n01 + [(1, 0)] * n10 + [(1, 1)] * n11
    ids = [f"c{i}" for i in range(len(cells))]
    return {i: x for i, (x, _) in zip(ids, cells)}, {i: y for i, (_, y) in zip(ids, cells)}


# --- accuracy ---------------------------------------------------------------

def test_accuracy_is_fraction_correct_not_percentage_points():
    assert accuracy({"a": 1, "b": 0, "c": 1, "d": 1}) == 0.75


def test_accuracy_of_no_cases_is_refused():
    with pytest.raises(ValueError):
        accuracy({})


def test_accuracy_by_family_matches_hand_count():
    rows = [
        {"family": "arith", "correct": 1},
        {"family": "arith", "correct": 0},
        {"family": "arith", "correct": 1},
        {"family": "arith", "correct": 1},
        {"family": "qa", "correct": 0},
        {"family": "qa", "correct": 1},
    ]
    # arith 3/4, qa 1/2, overall pooled 4/6 (not the mean of families, 5/8).
    assert accuracy_by_family(rows) == {"arith": 0.75, "qa": 0.5, "overall": 4 / 6}


# --- paired change ------------------------------------------------------------

def test_paired_change_matches_hand_computed_tiny_example():
    # d = [1, 0, 1, -1]: mean 0.25; sample var = (0.5625+0.0625+0.5625+1.5625)/3
    # = 2.75/3, so se = sqrt(2.75/3)/2.
    a = {"w": 1, "x": 1, "y": 1, "z": 0}
    b = {"w": 0, "x": 1, "y": 0, "z": 1}
    r = paired_change(a, b, z=2.0)
    se = math.sqrt(2.75 / 3) / 2
    assert r["n"] == 4
    assert r["mean"] == pytest.approx(0.25)
    assert r["se"] == pytest.approx(se)
    assert r["lo"] == pytest.approx(0.25 - 2 * se)
    assert r["hi"] == pytest.approx(0.25 + 2 * se)


def test_paired_change_matches_scipy_on_known_differences():
    a_map, b_map, a, b = _two_correlated_arms()
    d = a - b
    r = paired_change(a_map, b_map, z=Z)
    se = sps.sem(d)  # ddof=1 by default
    assert r["n"] == 1024
    assert r["mean"] == pytest.approx(np.mean(d), abs=1e-15)
    assert r["se"] == pytest.approx(se, rel=1e-12)
    assert r["lo"] == pytest.approx(np.mean(d) - Z * se, rel=1e-12)
    assert r["hi"] == pytest.approx(np.mean(d) + Z * se, rel=1e-12)
    # The change is a fraction: the difference of the two accuracies.
    assert r["mean"] == pytest.approx(accuracy(a_map) - accuracy(b_map))


def test_paired_change_on_continuous_scores_matches_scipy():
    rng = np.random.default_rng(7)
    x = rng.normal(size=300)
    y = x + rng.normal(0.1, 0.3, size=300)
    ids = [f"p{i}" for i in range(300)]
    r = paired_change(dict(zip(ids, x)), dict(zip(ids, y)), z=Z)
    assert r["mean"] == pytest.approx(np.mean(x - y), rel=1e-12)
    assert r["se"] == pytest.approx(sps.sem(x - y), rel=1e-12)


def test_all_equal_differences_give_zero_se_and_degenerate_interval():
    # 0.1 is not exact in binary, so a naive std can come out ~1e-17.
    a = {f"c{i}": 0.3 for i in range(37)}
    b = {f"c{i}": 0.2 for i in range(37)}
    r = paired_change(a, b, z=Z)
    assert r["se"] == 0.0
    assert r["lo"] == r["hi"] == r["mean"]
    assert r["mean"] == pytest.approx(0.1)


def test_single_case_is_refused_because_no_standard_error():
    with pytest.raises(ValueError, match="at least 2"):
        paired_change({"only": 1}, {"only": 0}, z=Z)


def test_mismatched_case_ids_are_refused_with_count():
    a = {"c1": 1, "c2": 0, "c3": 1}
    b = {"c1": 1, "c2": 0, "c4": 1, "c5": 0}
    with pytest.raises(ValueError, match="3 case ids differ"):
        paired_change(a, b, z=Z)
    with pytest.raises(ValueError, match="case ids differ"):
        mcnemar_exact_p(a, b)
    with pytest.raises(ValueError, match="case ids differ"):
        retention_change(a, b, z=Z)


def test_pairing_is_by_case_id_not_dict_order():
    a_map, b_map, _, _ = _two_correlated_arms()
    items = list(b_map.items())
    random.Random(3).shuffle(items)
    shuffled_b = dict(items)
    assert list(shuffled_b) != list(b_map)
    assert paired_change(a_map, shuffled_b, z=Z) == paired_change(a_map, b_map, z=Z)
    assert mcnemar_exact_p(a_map, shuffled_b) == mcnemar_exact_p(a_map, b_map)


# --- McNemar ------------------------------------------------------------------

@pytest.mark.parametrize(
    "b01, b10",
    [(0, 0), (0, 5), (5, 0), (7, 3), (3, 7), (1, 1), (10, 10), (40, 61), (480, 530), (2000, 2150)],
)
def test_mcnemar_exact_p_matches_scipy_binomtest(b01, b10):
    a, b = _pairs_from_counts(n00=11, n01=b01, n10=b10, n11=23)
    r = mcnemar_exact_p(a, b)
    assert (r["b01"], r["b10"]) == (b01, b10)
    n = b01 + b10
    expected = 1.0 if n == 0 else sps.binomtest(min(b01, b10), n, 0.5).pvalue
    assert r["p"] == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert 0.0 <= r["p"] <= 1.0


def test_mcnemar_counts_discordant_pairs_on_synthetic_arms():
    a_map, b_map, a, b = _two_correlated_arms()
    r = mcnemar_exact_p(a_map, b_map)
    assert r["b01"] == int(np.sum((a == 0) & (b == 1)))
    assert r["b10"] == int(np.sum((a == 1) & (b == 0)))
    k, n = min(r["b01"], r["b10"]), r["b01"] + r["b10"]
    assert r["p"] == pytest.approx(sps.binomtest(k, n, 0.5).pvalue, rel=1e-9)


def test_mcnemar_refuses_non_binary_outcomes():
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact_p({"a": 1, "b": 0.5}, {"a": 0, "b": 1})


# --- retention ----------------------------------------------------------------

def test_retention_upper_bound_matches_scipy_sem():
    rng = np.random.default_rng(11)
    seed = rng.gamma(2.0, 1.0, size=500)
    cand = seed + rng.normal(0.02, 0.05, size=500)
    ids = [f"probe-{i}" for i in range(500)]
    d = cand - seed  # candidate minus seed: positive means forgetting
    # the plan's z (1.96) and two others: a bound that hard-codes any one multiplier fails
    for z in (1.96, 1.645, 2.5):
        r = retention_change(dict(zip(ids, cand)), dict(zip(ids, seed)), z=z)
        assert r["n"] == 500
        assert r["mean"] == pytest.approx(np.mean(d), rel=1e-12)
        assert r["se"] == pytest.approx(sps.sem(d), rel=1e-12)
        assert r["upper"] == pytest.approx(np.mean(d) + z * sps.sem(d), rel=1e-12)
        assert set(r) == {"mean", "se", "upper", "n"}
