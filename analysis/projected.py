"""The report's projection: the arms on the study's hosts (declared figures), and the arms
of the machine the study ran on re-projected to other link rates from its measurements.
The model and its inputs: `gradshare.projection`.

Rates are Mbit/s; a loopback rate (infinite) is written as None so that `verdicts.json`
stays plain JSON.
"""
from __future__ import annotations

import math

from gradshare import metrics as M
from gradshare import projection as P

STUDY_RATES_GBIT = (5, 10, 20, 50, 100)  # the plot's link rates around the plan's
MEASURED_RATE_FACTORS = (0.5, 1, 2)  # the measured machine at these multiples of its link


def _clean(rows: list[dict]) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()} for r in rows]


def compute(rec) -> dict:
    plan = rec.plan
    hosts_plan = P.full_shape(plan)
    hosts = P.study_hosts(hosts_plan)
    link = hosts.link_mbit
    at_plan = [P.project(hosts, "single", 1, math.inf, hosts_plan.train_docs, hosts_plan.schedule.docs_per_update)]
    at_plan += [P.project(hosts, arm, 2, link, hosts_plan.train_docs, hosts_plan.schedule.docs_per_update)
                for arm in hosts.arms]
    by_rate = [P.project(hosts, arm, 2, g * 1e3, hosts_plan.train_docs, hosts_plan.schedule.docs_per_update)
               for arm in hosts.arms for g in STUDY_RATES_GBIT]
    out = {"study_hosts": {"machine": hosts.name, "source": hosts.source, "link_mbit": link,
                           "rows": _clean(at_plan), "by_rate": _clean(by_rate)}}
    arms = {}
    for arm, a in rec.arms.items():
        if a.status != "FINISHED" or not a.histories.get(M.STEP_S):
            continue
        arms[arm] = {"step_s": a.histories[M.STEP_S], "tokens_per_s": a.histories.get(M.TOKENS_PER_S),
                     "logical_bytes": a.histories.get(M.LOGICAL_BYTES) or [],
                     "link_rate_mbit": a.params.get("link_rate_mbit")}
    if "single" not in arms:
        out["measured"] = {"reason": "the single arm did not finish: no one-device update to start from"}
        return out
    m = P.from_measurements(plan, arms, "this study's machine")
    if not m.arms:
        out["measured"] = {"reason": "no two-process arm finished over a link of known rate"}
        return out
    base = m.link_mbit
    rates = [base] if (math.isinf(base) or math.isnan(base)) else [base * f for f in MEASURED_RATE_FACTORS]
    rows = []
    for arm in m.arms:
        for r in rates:
            row = P.project(m, arm, 2, r, plan.train_docs, plan.schedule.docs_per_update)
            if r == base:
                row["measured_s_per_update"] = m.measured_s[arm]
            rows.append(row)
    out["measured"] = {"machine": m.name, "source": m.source, "link_mbit": None if math.isinf(base) else base,
                       "single_s": m.single_s, "extra_s": {a: i.extra_s for a, i in m.arms.items()},
                       "rows": _clean(rows)}
    return out
