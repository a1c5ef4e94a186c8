"""When a verdict applies: the one place that says whether each screen may be decided.

Every screen asks `preconditions(rec)` first and decides only where it `applies`;
otherwise its `pass` is null and the reason is this function's. The rules:
  - seed kind: a randomly initialised seed model (`random-*`) is throughput work; no
    quality verdict applies to it (status `not-applicable`), the speed screen still does;
  - arms: every arm a screen needs — the candidate and each control for quality, the
    candidate and the plan's `screen.speed_baseline` for speed — must have FINISHED
    (and, for quality, be scored together with the seed); otherwise status `missing`;
  - attempts: an arm's outcome counts only if it came from an attempt the plan permits
    (`arms.max_attempts`); an arm that finished on a later permitted attempt still counts,
    and the screen carries a note saying so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECIDED, MISSING, NOT_APPLICABLE = "decided", "missing", "not-applicable"


@dataclass(frozen=True)
class Precondition:
    status: str  # DECIDED (the screen may pass or fail), MISSING or NOT_APPLICABLE (pass is null)
    reason: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    missing: tuple[tuple[str, str], ...] = ()  # (arm, why) for each arm the screen lacks

    @classmethod
    def lacking(cls, problems: list[tuple[str, str]], notes: list[str]) -> "Precondition":
        reason = "; ".join(f"{arm}: {why}" for arm, why in problems) or None
        return cls(MISSING if problems else DECIDED, reason, tuple(notes), tuple(problems))

    @property
    def applies(self) -> bool:
        return self.status == DECIDED


def _attempts(rec, arm: str) -> list[dict]:
    entry = next((e for e in (rec.commitment or {}).get("arms", []) if e["arm"] == arm), None)
    return list((entry or {}).get("attempts") or [])


def _arm_problems(rec, arms: list[str], scored: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """(arm, why) for each of the given arms that cannot be judged, and notes about later attempts."""
    plan, problems, notes = rec.plan, [], []
    for arm in arms:
        if arm == "seed":
            if scored and "seed" not in rec.scores:
                problems.append(("seed", "not scored"))
            continue
        a = rec.arms.get(arm)
        if a is None or a.status != "FINISHED":
            problems.append((arm, a.failure_reason if a and a.failure_reason else "no finished run"))
            continue
        tries = _attempts(rec, arm)
        if len(tries) > plan.arms.max_attempts:
            problems.append((arm, f"{len(tries)} attempts recorded, more than arms.max_attempts="
                                  f"{plan.arms.max_attempts} permits"))
            continue
        if len(tries) > 1:
            notes.append(f"{arm} finished on attempt {len(tries)} of {plan.arms.max_attempts} permitted "
                         f"(earlier: " + "; ".join(f"{t['status']}: {t['failure_reason']}" for t in tries[:-1])
                         + ")")
        if scored and arm not in rec.scores:
            problems.append((arm, "finished training but has no score run"))
    return problems, notes


def preconditions(rec) -> dict[str, Precondition]:
    """For `quality_screen` and `speed_screen`: whether it is decided, and why not."""
    plan = rec.plan
    cand = plan.arms.candidate
    out = {}
    if plan.model.source.startswith("random-"):
        out["quality_screen"] = Precondition(
            NOT_APPLICABLE, f"the seed model is randomly initialised ({plan.model.source}): "
                            f"throughput work only, no quality verdict applies")
    else:
        out["quality_screen"] = Precondition.lacking(
            *_arm_problems(rec, [cand, *plan.arms.controls, "seed"], scored=True))
    out["speed_screen"] = Precondition.lacking(*_arm_problems(rec, [cand, plan.screen.speed_baseline],
                                                              scored=False))
    return out


def screen_word(screen: dict) -> str:
    """A decided or undecided screen in one word, as its tag holds it: pass, fail,
    not-applicable (e.g. random seed weights) or null (an arm it needs is missing)."""
    if screen["pass"] is None:
        return NOT_APPLICABLE if screen.get("status") == NOT_APPLICABLE else "null"
    return "pass" if screen["pass"] else "fail"
