"""Step-time regression: is a rank's recent step time a given factor above its baseline? Pure (plain lists in,
a frozen result out); server.captures.auto feeds it a rank's steps and requests a capture when it fires."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class StepRegression:
    baseline_median_step_s: float
    recent_median_step_s: float
    factor: float  # recent / baseline
    baseline_steps: tuple[int, int]  # first and last step of each window
    recent_steps: tuple[int, int]


def step_regression(baseline: list[tuple[int, float]], recent: list[tuple[int, float]], *,
                    min_factor: float) -> StepRegression | None:
    """`baseline`, `recent`: (step, wall_s) pairs. The regression when the recent window lies wholly after the
    baseline and its median step time exceeds `min_factor` x the baseline's; else None."""
    if not baseline or not recent:
        return None
    base_steps = [s for s, _ in baseline]
    recent_steps = [s for s, _ in recent]
    if min(recent_steps) <= max(base_steps):
        return None  # the windows overlap: not enough steps yet
    base = median(w for _, w in baseline)
    now = median(w for _, w in recent)
    if base <= 0 or now <= min_factor * base:
        return None
    return StepRegression(baseline_median_step_s=base, recent_median_step_s=now, factor=now / base,
                          baseline_steps=(min(base_steps), max(base_steps)),
                          recent_steps=(min(recent_steps), max(recent_steps)))
