"""The speed screen, decided in one place: an arm's throughput over the plan's baseline arm's
(`screen.speed_baseline`), passed at `screen.speed_ratio` or more. The verdict (measured active
tokens/s), the projection (modelled tokens/s on the study's hosts), the preflight's go/no-go and
the report all ask this function, so a plan whose baseline is `dense` is judged and described
against dense everywhere.

    from gradshare.contract import speed
    s = speed.screen(plan, {"single": 900.0, "dense": 1500.0, "powersgd": 1700.0})
    s.ratio, s.passes, s.baseline     # 1.889, True, 'single'
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SpeedScreen:
    arm: str
    baseline: str
    ratio: float
    """The arm's tokens/s over the baseline's."""
    threshold: float

    @property
    def passes(self) -> bool:
        return self.ratio >= self.threshold


def screen(plan, tokens_per_s: Mapping[str, float], arm: str | None = None) -> SpeedScreen:
    """`arm` (default: the plan's candidate) against the plan's speed baseline, from each arm's
    tokens per second. Both must be in `tokens_per_s`: a missing arm is the caller's to report."""
    arm = arm or plan.arms.candidate
    base = plan.screen.speed_baseline
    return SpeedScreen(arm=arm, baseline=base, ratio=tokens_per_s[arm] / tokens_per_s[base],
                       threshold=plan.screen.speed_ratio)
