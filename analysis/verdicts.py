"""The verdicts: accuracy, paired changes, retention, the two screens and the cost.

Every comparison pairs per-case results on case ids (`analysis.stats`). Whether a
screen may be decided at all is `analysis.preconditions`' answer alone: where it is
not (an arm failed or was unavailable, or the seed model is random weights), the
screen is `pass: null` with the reason and its `status`, never true or false.
Accuracy changes are fractions in the statistics and percentage points (pp) in the
screens, which the plan declares in pp.
"""
from __future__ import annotations

from analysis import projected
from analysis.collect import StudyRecord
from analysis.preconditions import Precondition, preconditions
from analysis.stats import (
    accuracy_by_family,
    mcnemar_exact_p,
    paired_change,
    retention_change,
)
from gradshare.contract import metrics as M
from gradshare.contract import speed
from gradshare.cost.accounting import arm_cost, cost_words, study_budget


def pairs(plan) -> list[tuple[str, str]]:
    """candidate-seed, candidate-each control (the screens' comparisons), and each other arm-seed:
    every control's, and any further arm's (a fourth arm's gain is reported, never screened)."""
    cand, controls = plan.arms.candidate, list(plan.arms.controls)
    others = controls + [a for a in plan.arms.names if a != cand and a not in controls]
    return [(cand, "seed")] + [(cand, c) for c in controls] + [(a, "seed") for a in others]


def compute(rec: StudyRecord) -> dict:
    plan, z = rec.plan, rec.plan.screen.z
    cand = plan.arms.candidate
    correct = {m: {r["case_id"]: r["correct"] for r in s["test"]} for m, s in rec.scores.items()}
    nll = {m: {r["probe_id"]: r["nll_nats"] for r in s["retention"]} for m, s in rec.scores.items()}

    arms = {"seed": {"status": "FINISHED" if "seed" in rec.scores else "UNAVAILABLE",
                     "failure_reason": None if "seed" in rec.scores else "not scored: the study is not scored"}}
    committed = {e["arm"]: e for e in (rec.commitment or {}).get("arms", [])}
    for name, a in rec.arms.items():
        arms[name] = {"status": a.status, "failure_reason": a.failure_reason, "run_id": a.run_id,
                      "attempts": (committed.get(name) or {}).get("attempts", []),
                      "link": a.params.get("link")}
    for name, entry in arms.items():
        s = rec.scores.get(name)
        entry["accuracy"] = accuracy_by_family(s["test"]) if s else None
        entry["retention_nll"] = (sum(nll[name].values()) / len(nll[name])) if s else None
        if name != "seed" and entry["status"] == "FINISHED" and not s:
            entry["failure_reason"] = "finished training but has no score run"

    paired = {}
    for a, b in pairs(plan):
        key = f"{a}-{b}"
        if a in correct and b in correct:
            paired[key] = paired_change(correct[a], correct[b], z) | {
                "mcnemar": mcnemar_exact_p(correct[a], correct[b]), "unit": "fraction"}
        else:
            paired[key] = {"mean": None, "se": None, "lo": None, "hi": None, "n": 0,
                           "reason": _missing(rec, a, b)}
    retention = {}
    for arm in plan.arms.names:
        if arm in nll and "seed" in nll:
            retention[arm] = retention_change(nll[arm], nll["seed"], z)
        else:
            retention[arm] = {"mean": None, "se": None, "upper": None, "n": 0,
                              "reason": _missing(rec, arm, "seed")}

    costs = {arm: (arm_cost(plan, arm, a.metrics, a.hosts) if a.status == "FINISHED" else None)
             for arm, a in rec.arms.items()}
    for arm, c in costs.items():
        if c:
            c.update(after_warmup(rec.arms[arm], plan.powersgd.warmup_updates))
    pre = preconditions(rec)
    return {
        "study": rec.study, "plan_sha256": plan.sha256(), "z": z, "candidate": cand,
        "controls": list(plan.arms.controls), "arms": arms, "pairs": list(paired), **paired,
        "retention_change": retention,
        "quality_screen": quality_screen(plan, pre["quality_screen"], paired, retention),
        "speed_screen": speed_screen(plan, pre["speed_screen"], rec, costs),
        "cost": costs, "budget": study_budget(plan, costs),
        "seed_model": rec.plan.model.source,
        "projection": _projection(rec),
        "emulation": (f"{plan.study.profile} profile, CPU emulation: speed and dollars are not the study's"
                      if plan.emulated else plan.rehearsal_note),
    }


def after_warmup(a, warmup: int) -> dict:
    """Logical and wire bytes per host over the updates after the plan's warm-up, the same
    updates for every arm (the summary metric of dense counts all of them)."""
    def total(key):
        return sum(v for step, v in (a.histories.get(key) or []) if step > warmup)

    hosts = max(len(a.hosts), 1)
    return {"logical_bytes_after_warmup": total(M.LOGICAL_BYTES),
            "wire_tx_per_host_after_warmup": total(M.WIRE_TX_BYTES) / hosts,
            "wire_rx_per_host_after_warmup": total(M.WIRE_RX_BYTES) / hosts}


def _projection(rec: StudyRecord) -> dict:
    """The report's projection; a failure to project is a line in the report, never a lost analysis."""

    try:
        return projected.compute(rec)
    except Exception as exc:  # noqa: BLE001 - the verdicts stand without it
        return {"reason": f"projection failed: {type(exc).__name__}: {exc}"}


def _missing(rec: StudyRecord, *models: str) -> str:
    reasons = []
    for m in models:
        if m in rec.scores:
            continue
        a = rec.arms.get(m)
        why = a.failure_reason if a and a.failure_reason else "not scored"
        reasons.append(f"{m}: {why}")
    return "; ".join(reasons) or "missing"


def _undecided(pre: Precondition) -> dict:
    out = {"pass": None, "status": pre.status, "reason": pre.reason, "notes": list(pre.notes)}
    return out | ({"missing": dict(pre.missing)} if pre.missing else {})


def quality_screen(plan, pre: Precondition, paired, retention) -> dict:
    if not pre.applies:
        return _undecided(pre)
    s, cand = plan.screen, plan.arms.candidate
    gain_pp = 100 * paired[f"{cand}-seed"]["mean"]
    lows = {c: 100 * paired[f"{cand}-{c}"]["lo"] for c in plan.arms.controls}
    checks = {
        "task_gain": {"value_pp": gain_pp, "threshold_pp": s.task_gain_pp, "pass": gain_pp >= s.task_gain_pp},
        "retention": {"upper_nats": retention[cand]["upper"], "threshold_nats": s.retention_upper_nats,
                      "pass": retention[cand]["upper"] <= s.retention_upper_nats},
        **{f"noninferior_to_{c}": {"lower_pp": lo, "threshold_pp": s.noninferiority_pp,
                                   "pass": lo >= s.noninferiority_pp} for c, lo in lows.items()},
    }
    return {"pass": all(c["pass"] for c in checks.values()), "status": pre.status, "checks": checks,
            "notes": list(pre.notes)}


def speed_screen(plan, pre: Precondition, rec, costs) -> dict:
    cand, base = plan.arms.candidate, plan.screen.speed_baseline
    if not pre.applies:
        return _undecided(pre) | {"baseline": base, "cost_words": cost_words(None, None, None, base)}
    tps = {a: rec.arms[a].metrics[M.ACTIVE_TOKENS_PER_S] for a in (cand, base)}
    screen = speed.screen(plan, tps)
    return {"pass": screen.passes, "status": pre.status, "baseline": base,
            "candidate_active_tokens_per_s": tps[cand], "baseline_active_tokens_per_s": tps[base],
            "ratio": screen.ratio, "threshold": screen.threshold, "notes": list(pre.notes),
            "cost_words": cost_words(costs[cand], costs[base], screen.ratio, base)}


# --- the verdict as the analyze run's metrics: columns of the study's runs table in the UI ---
SPEED_RATIO = "verdict/speed_ratio"  # candidate's active tokens/s over the speed baseline's
TASK_GAIN_PP = "verdict/task_gain_pp"  # candidate - seed, mean paired change, percentage points
TASK_GAIN_LO_PP = "verdict/task_gain_lo_pp"  # its lower bound (mean - z se)
RETENTION_UPPER_NATS = "verdict/retention_upper_nats"  # candidate - seed, upper bound, nats/token
COST_FIGURES = ("gpu_s_total", "usd", "cross_zone_usd")  # of each finished arm, as `cost` holds them


def noninferior_lo_pp(control: str) -> str:
    """Lower bound of candidate - `control` in percentage points (the non-inferiority check's figure)."""
    return f"verdict/noninferior_{control}_lo_pp"


def cost_metric(arm: str, figure: str) -> str:
    return f"cost/{arm}/{figure}"


def verdict_metrics(v: dict) -> dict[str, float]:
    """The figures the screens are decided on, from a verdicts dict, wherever the study has them
    (a screen left undecided by a missing control still shows the candidate's gain), and each
    finished arm's cost. Nothing is computed here that `compute` did not."""
    cand, out = v["candidate"], {}
    gain = v[f"{cand}-seed"]
    if gain["mean"] is not None:
        out[TASK_GAIN_PP], out[TASK_GAIN_LO_PP] = 100 * gain["mean"], 100 * gain["lo"]
    if (upper := v["retention_change"][cand]["upper"]) is not None:
        out[RETENTION_UPPER_NATS] = upper
    for c in v["controls"]:
        if (lo := v[f"{cand}-{c}"]["lo"]) is not None:
            out[noninferior_lo_pp(c)] = 100 * lo
    if v["speed_screen"].get("ratio") is not None:
        out[SPEED_RATIO] = v["speed_screen"]["ratio"]
    for arm, c in v["cost"].items():
        for figure in COST_FIGURES if c else ():
            out[cost_metric(arm, figure)] = c[figure]
    return out
