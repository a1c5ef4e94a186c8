"""The report's projection: the study's hosts (`gradshare.cost.projection`: the prepared workload, the
H200's measured cost parts scaled to the plan's GPU, the plan's link), and the arms of the machine
the study ran on re-projected to other link rates from their own runs (`gradshare.cost.link`).

One figure per quantity: the measured machine's table shows each arm's speed ratio as the verdict
computes it (active tokens/s over the speed baseline's, `gradshare.contract.speed`), beside the model's, which is built on median
seconds per update and says so. An arm measured over loopback crossed no link and is shown at
loopback only; an arm that did not finish is listed with its status, never dropped.
Rates are Mbit/s; a loopback rate (infinite) is written as None so that `verdicts.json` stays
plain JSON.
"""
from __future__ import annotations

import math

from gradshare.contract import metrics as M
from gradshare.contract import speed
from gradshare.cost import link as ML
from gradshare.cost import projection as P
from gradshare.tracking import connection
from gradshare.tracking import figures as study_figures

MEASURED_RATE_FACTORS = (0.5, 1, 2)  # the measured machine at these multiples of its link


def _clean(rows: list[dict]) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()} for r in rows]


def compute(rec) -> dict:
    prep = connection.client().get_run(rec.prepare_run_id)
    hosts = P.for_plan(rec.plan, study_figures.study_workload(prep, rec.plan), log=lambda *a: None)
    hosts["rows"] = _clean(hosts["rows"])
    return {"study_hosts": hosts, "measured": _measured(rec)}


def _measured(rec) -> dict:
    plan = rec.plan
    arms, missing = {}, {}
    for arm, a in rec.arms.items():
        if a.status != "FINISHED" or not a.histories.get(M.STEP_S):
            missing[arm] = a.failure_reason or a.status
            continue
        arms[arm] = {"step_s": a.histories[M.STEP_S], "tokens_per_s": a.histories.get(M.TOKENS_PER_S),
                     "logical_bytes": a.histories.get(M.LOGICAL_BYTES) or [],
                     "link_rate_mbit": a.params.get("link_rate_mbit")}
    if not set(plan.one_process_arms()) & set(arms):
        return {"reason": "no one-process arm (kind single) finished: no one-device update to start from",
                "missing": missing}
    m = ML.from_measurements(plan, arms, "this study's machine")
    if not m.arms:
        return {"reason": "no two-process arm finished over a link of known rate", "missing": missing}
    base = m.link_mbit
    looped = math.isinf(base) or math.isnan(base)
    rates = [base] if looped else [base * f for f in MEASURED_RATE_FACTORS]
    measured_tps = {a: rec.arms[a].metrics.get(M.ACTIVE_TOKENS_PER_S) for a in rec.arms}
    baseline = plan.screen.speed_baseline
    rows = []
    for arm in m.arms:
        for r in rates:
            row = ML.with_speed_ratio(m, plan, ML.project(m, arm, 2, r, plan.train_docs, plan.schedule.docs_per_update))
            if r == base:
                row["measured_s_per_update"] = m.measured_s[arm]
                if measured_tps.get(arm) and measured_tps.get(baseline):  # the verdict's own figure
                    row["measured_speed_ratio"] = speed.screen(plan, measured_tps, arm).ratio
            rows.append(row)
    return {"machine": m.name, "source": m.source, "link_mbit": None if math.isinf(base) else base,
            "single_s": m.single_s, "extra_s": {a: i.extra_s for a, i in m.arms.items()},
            "rows": _clean(rows), "missing": missing}
