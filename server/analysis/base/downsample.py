"""Min/max-preserving downsampling of a time series for plots.

Each bucket of consecutive samples keeps its minimum and its maximum, in time order (the "M4"/min-max
idea without first/last). Peaks are what users look for in memory and power plots, and a plain stride
or mean would hide exactly those: here the global minimum and maximum always survive, bit for bit.
"""

from __future__ import annotations

import numpy as np


def downsample(ts: np.ndarray, values: np.ndarray, n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `n_points` (ts, value) pairs keeping each bucket's min and max; NaN samples are dropped.

    Series already short enough come back unchanged (minus NaNs). `n_points` below 2 is raised to 2, the
    least that can hold both extremes.
    """
    ts = np.asarray(ts, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if ts.shape != values.shape:
        raise ValueError(f"ts has shape {ts.shape}, values {values.shape}")
    keep = ~np.isnan(values)
    if not keep.all():
        ts, values = ts[keep], values[keep]
    n = values.shape[0]
    n_points = max(2, int(n_points))
    if n <= n_points:
        return ts.copy(), values.copy()

    idx = minmax_indices(values, n_points)
    return ts[idx], values[idx]


def minmax_indices(values: np.ndarray, n_points: int, *, keep_ends: bool = False) -> np.ndarray:
    """Sorted indices of each bucket's minimum and maximum, at most `n_points` of them (plus the first and last
    sample with `keep_ends`); every index when the series is short enough. `values` holds no NaN."""
    n = values.shape[0]
    n_points = max(2, int(n_points))
    if n <= n_points:
        return np.arange(n)
    n_buckets = n_points // 2
    width = -(-n // n_buckets)  # ceil: equal-width buckets, the last one possibly short
    n_buckets = -(-n // width)
    pad = n_buckets * width - n
    # Pad with +inf / -inf so padding never wins an argmin / argmax.
    lo = np.concatenate([values, np.full(pad, np.inf)]).reshape(n_buckets, width)
    hi = np.concatenate([values, np.full(pad, -np.inf)]).reshape(n_buckets, width)
    base = np.arange(n_buckets) * width
    ends = np.array([0, n - 1] if keep_ends else [], dtype=np.int64)
    # sorted: time order, and min == max kept once
    return np.unique(np.concatenate([base + np.argmin(lo, axis=1), base + np.argmax(hi, axis=1), ends]))
