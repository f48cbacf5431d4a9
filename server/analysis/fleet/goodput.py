"""Goodput: allocated GPU time split into idle, input-stalled, throttled and productive (issue #20).

Per sample of a GPU inside a job's window (allocated time), with d the seconds the sample stands for
(sample-and-hold, `base.durations`) and u its NVML utilization.gpu (the share of the sample period a kernel ran):

- **idle**: u < IDLE_UTIL_PCT in a run of such samples lasting at least IDLE_RUN_S: the GPU held, nothing running;
- **input-stalled**: the time no kernel ran while the job was running: d for a low sample in a shorter run (a
  gap between bursts of work), and d x (1 - u/100) of a busy sample (u >= IDLE_UTIL_PCT): the GPU waited on the
  host (input pipeline, CPU-side work, launch gaps, host synchronisation);
- **throttled**: d x u/100 of a busy sample with a slowdown clock-event reason (thermal, power cap, hardware;
  `health.reasons`): kernels ran, at reduced clocks;
- **productive**: d x u/100 of a busy sample without one;
- **unknown**: samples whose utilization is unknown (MIG, unsupported): their whole d.

The five add up to the allocated time exactly. Utilization is NVML's, not SM occupancy: a kernel that uses one SM
counts as busy (the GPM metrics, where the agent sends them, say how much of the GPU it used).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from server.analysis.energy.accounting import IDLE_UTIL_PCT

IDLE_RUN_S = 60.0
HOUR_S = 3600.0


def idle_runs(util: np.ndarray, dur: np.ndarray, *, min_run_s: float = IDLE_RUN_S) -> np.ndarray:
    """Which samples belong to a run of consecutive low-utilization samples (u < IDLE_UTIL_PCT) lasting at least
    `min_run_s` (the run's summed durations)."""
    u = np.asarray(util, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        low = ~np.isnan(u) & (u < IDLE_UTIL_PCT)
    if not low.any():
        return low
    edges = np.diff(np.concatenate([[0], low.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    c = np.concatenate([[0.0], np.cumsum(np.asarray(dur, dtype=np.float64))])
    long_run = (c[ends] - c[starts]) >= min_run_s  # vectorised: a GPU flickering idle has thousands of runs an hour
    # +1 where a long run starts, -1 where it ends: the running sum marks its samples
    marks = np.zeros(u.size + 1, dtype=np.int64)
    np.add.at(marks, starts[long_run], 1)
    np.add.at(marks, ends[long_run], -1)
    return np.cumsum(marks[:-1]) > 0


def goodput_terms(util: np.ndarray, dur: np.ndarray, throttled: np.ndarray | None,
                  idle_run: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per sample, the seconds of each bucket but unknown (zero where utilization is unknown)."""
    u = np.asarray(util, dtype=np.float64)
    known = ~np.isnan(u)
    u0 = np.where(known, u, 0.0)
    low = known & (u0 < IDLE_UTIL_PCT)
    busy = known & ~low
    long_idle = low & (idle_run if idle_run is not None else idle_runs(u, dur))
    slow = np.zeros(u.size, dtype=bool) if throttled is None else np.asarray(throttled, dtype=bool)
    kernel = dur * u0 / 100.0
    return {
        "idle_s": np.where(long_idle, dur, 0.0),
        "stalled_s": np.where(low & ~long_idle, dur, 0.0) + np.where(busy, dur - kernel, 0.0),
        "throttled_s": np.where(busy & slow, kernel, 0.0),
        "productive_s": np.where(busy & ~slow, kernel, 0.0),
    }


def goodput_figures(sums: Mapping[str, float | None]) -> dict[str, float | None]:
    """GPU-hours per bucket from summed seconds (covered_s and the GOODPUT fields of rollup rows); `unknown` is the
    allocated time no bucket holds (utilization unknown, or hours rolled up before goodput existed)."""
    covered = float(sums.get("covered_s") or 0.0)
    parts = {k: float(sums.get(k) or 0.0) for k in ("idle_s", "stalled_s", "throttled_s", "productive_s")}
    unknown = max(0.0, covered - sum(parts.values()))
    known = covered - unknown
    return {
        "allocated_gpu_hours": covered / HOUR_S,
        "idle_gpu_hours": parts["idle_s"] / HOUR_S,
        "input_stalled_gpu_hours": parts["stalled_s"] / HOUR_S,
        "throttled_gpu_hours": parts["throttled_s"] / HOUR_S,
        "productive_gpu_hours": parts["productive_s"] / HOUR_S,
        "unknown_gpu_hours": unknown / HOUR_S,
        "productive_fraction": parts["productive_s"] / known if known > 0 else None,
    }
