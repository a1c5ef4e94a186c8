"""Statistics for the pre-registered method study.

Every comparison in the study is *paired*: two fine-tuned models are scored on
the same evaluation cases (or the same retention probes), and we analyse the
per-case differences. Pairing is always by case id, never by position, so the
order in which a caller built its dicts cannot change an answer, and two arms
whose case sets differ are refused rather than silently truncated.

Units: accuracies and accuracy changes are returned as *fractions*
(0.1 means 10 percentage points). Converting to percentage points for tables
or the write-up is the caller's job; nothing here multiplies by 100.

The critical value ``z`` is passed in by the caller rather than fixed here, so
that the value declared in the pre-registration (e.g. 1.96 two-sided, or
1.645 for the one-sided retention bound) is the one that is used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np


def _check_binary(values: Iterable, what: str) -> None:
    # Correctness must be 0/1; a stray 0.5 or 2 would quietly skew a mean.
    bad = [v for v in values if v not in (0, 1)]
    if bad:
        raise ValueError(f"{what}: expected 0/1 values, got e.g. {bad[0]!r}")


def _check_z(z: float) -> None:
    if not (math.isfinite(z) and z >= 0):
        raise ValueError(f"z must be a finite non-negative number, got {z!r}")


def accuracy(per_case: Mapping[str, int]) -> float:
    """Fraction of cases answered correctly (mean of 0/1 values)."""
    if not per_case:
        raise ValueError("accuracy of an empty set of cases is undefined")
    _check_binary(per_case.values(), "accuracy")
    return sum(per_case.values()) / len(per_case)


def accuracy_by_family(rows: Iterable[dict]) -> dict[str, float]:
    """Accuracy per task family plus ``"overall"``.

    ``rows`` are dicts with at least ``"family"`` and ``"correct"`` (0/1).
    ``"overall"`` is pooled over all rows (each case weighs the same), not the
    mean of the family accuracies.
    """
    counts: dict[str, list[int]] = {}  # family -> [correct, total]
    for row in rows:
        family, correct = row["family"], row["correct"]
        _check_binary([correct], f"family {family!r}")
        if family == "overall":
            # Would collide with the pooled key in the result.
            raise ValueError('"overall" is reserved and cannot be a family name')
        c = counts.setdefault(family, [0, 0])
        c[0] += int(correct)
        c[1] += 1
    if not counts:
        raise ValueError("accuracy_by_family needs at least one row")
    result = {fam: c / n for fam, (c, n) in counts.items()}
    result["overall"] = sum(c for c, _ in counts.values()) / sum(n for _, n in counts.values())
    return result


def _paired_differences(a: Mapping[str, float], b: Mapping[str, float]) -> np.ndarray:
    """a_i - b_i joined on case id; refuses arms whose id sets differ."""
    only_a, only_b = a.keys() - b.keys(), b.keys() - a.keys()
    if only_a or only_b:
        raise ValueError(
            f"{len(only_a) + len(only_b)} case ids differ between the arms "
            f"({len(only_a)} only in the first, {len(only_b)} only in the second)"
        )
    ids = sorted(a)  # a fixed order, so the result cannot depend on dict order
    d = np.array([a[i] for i in ids], dtype=float) - np.array([b[i] for i in ids], dtype=float)
    if not np.all(np.isfinite(d)):
        raise ValueError("paired values must be finite")
    return d


def _mean_and_se(d: np.ndarray) -> tuple[float, float]:
    n = d.size
    if n < 2:
        raise ValueError(f"need at least 2 paired cases for a standard error, got {n}")
    if np.all(d == d[0]):
        # Floating-point summation can leave a ~1e-17 spread for constant
        # input; the spread is exactly zero, so report it as such.
        return float(d[0]), 0.0
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))


def paired_change(a: Mapping[str, float], b: Mapping[str, float], z: float) -> dict:
    """Mean paired difference a - b with a normal interval mean -/+ z*se.

    ``a`` and ``b`` map case id -> value (0/1 correctness or any float).
    se is the sample standard deviation (ddof=1) of the differences over
    sqrt(n). Returns ``{"mean", "se", "lo", "hi", "n"}``; for accuracy these
    are fractions, not percentage points.
    """
    _check_z(z)
    d = _paired_differences(a, b)
    mean, se = _mean_and_se(d)
    return {"mean": mean, "se": se, "lo": mean - z * se, "hi": mean + z * se, "n": int(d.size)}


def mcnemar_exact_p(a: Mapping[str, int], b: Mapping[str, int]) -> dict:
    """Exact two-sided McNemar test on paired 0/1 outcomes.

    Only discordant cases carry information: b01 = #(a=0, b=1) and
    b10 = #(a=1, b=0). Under the null each discordant case is a fair coin, so
    p = min(1, 2 * P[Binom(b01 + b10, 1/2) <= min(b01, b10)]), and p = 1 when
    there are no discordant cases. Returns ``{"p", "b01", "b10"}``.
    """
    d = _paired_differences(a, b)  # same id checks as the interval
    _check_binary(a.values(), "mcnemar (first arm)")
    _check_binary(b.values(), "mcnemar (second arm)")
    b01, b10 = int(np.sum(d == -1)), int(np.sum(d == 1))
    n, k = b01 + b10, min(b01, b10)
    if n == 0:
        return {"p": 1.0, "b01": 0, "b10": 0}
    # Exact integer tail count; one rounding at the final division, so large
    # counts do not accumulate floating-point error.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return {"p": min(1.0, 2 * tail / 2**n), "b01": b01, "b10": b10}


def retention_change(candidate_nll: Mapping[str, float], seed_nll: Mapping[str, float], z: float) -> dict:
    """How much worse the candidate is than the seed on retention probes.

    Differences are candidate - seed NLL per probe, so a positive mean means
    forgetting. ``upper = mean + z*se`` is the one-sided normal upper bound
    declared in the pre-registration; the caller compares it to the margin.
    Returns ``{"mean", "se", "upper", "n"}``.
    """
    _check_z(z)
    d = _paired_differences(candidate_nll, seed_nll)
    mean, se = _mean_and_se(d)
    return {"mean": mean, "se": se, "upper": mean + z * se, "n": int(d.size)}
