"""Sample-and-hold time: the seconds each sample of a series stands for (the fleet rollups', the health findings'
and goodput's one rule)."""

from __future__ import annotations

import numpy as np


def sample_durations(ts: np.ndarray, *, max_gap_s: float | None = None) -> np.ndarray:
    """Seconds each sample stands for (sample-and-hold), gaps capped at one typical interval.

    A gap longer than `max_gap_s` (default 5 typical intervals: the agent was away) counts only one typical
    interval, so an outage is not booked as busy or idle time; the last sample also counts one typical interval.
    """
    ts = np.asarray(ts, dtype=np.float64)
    if ts.size == 0:
        return ts.copy()
    if ts.size == 1:
        return np.zeros(1)
    dt = np.diff(ts)
    typical = float(np.median(dt))
    cap = max_gap_s if max_gap_s is not None else 5.0 * typical
    dt = np.where(dt > cap, typical, dt)
    return np.concatenate([dt, [typical]])


def hold_last(values: np.ndarray) -> np.ndarray:
    """Each NaN replaced by the last value read before it (sample-and-hold of a field the agent reads every Nth
    sample, e.g. the health counters every 30th): leading NaNs stay NaN (nothing read yet: unknown)."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    if ok.all() or not ok.any():
        return v.copy()
    idx = np.where(ok, np.arange(v.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = v[idx]
    out[: int(np.argmax(ok))] = np.nan
    return out
