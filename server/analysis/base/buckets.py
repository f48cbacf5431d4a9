"""Time buckets of plotted series: one grid per time range, so that a job's stored plot views and a fresh SQL
read give the same points, bit for bit.

A range of span S is cut into FINE_BUCKETS buckets of `fine_width_us(S)` microseconds from just before its start
(SLACK_US / 2, so that clock noise cannot put its first instant in a bucket of its own). A plot
asking for `points` gets buckets of k fine buckets, k = ceil(FINE_BUCKETS / (points // 2)): at most points // 2
buckets, each drawn as its minima at its first timestamp and, when it holds more than one row, its maxima at
its last (the min/max idea of M4, so peaks survive at any zoom). As floor(floor(x / w) / k) == floor(x / (k w))
for integers, merging k stored fine buckets gives exactly the buckets of a query grouping at k w.

A budget gets between ~70 % and 100 % of its points (k is a whole number of fine buckets); several budgets asked
at once share the finest one's grid (`bucket_factors`), so one scan serves them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

FINE_BUCKETS = 4096
# Per fine bucket: the span's ends stay inside the grid (SQLite's epochs, via julianday, are ~0.2 ms off).
SLACK_US = 1000


def fine_width_us(span_s: float) -> int:
    """Width in whole microseconds of the fine buckets of a range `span_s` long (Postgres intervals are µs)."""
    return int(max(span_s, 0.0) * 1e6 // FINE_BUCKETS) + SLACK_US


def bucket_factors(points: Mapping[str, int]) -> dict[str, int]:
    """Fine buckets per plotted bucket for each series' points budget. Each is a multiple of the finest budget's
    factor, so that one grouping at the finest serves every series of a request."""
    need = {name: -(-FINE_BUCKETS // max(p // 2, 1)) for name, p in points.items()}
    base = min(need.values())
    return {name: base * -(-n // base) for name, n in need.items()}


@dataclass(frozen=True)
class Buckets:
    """Non-empty time buckets of one series group, in bucket order: `index` counts buckets from the range's
    start; `first_s`/`last_s` are the epoch seconds of the first and last row in each; `count` rows each (of one
    column, or of rows when columns share it); `low`/`high` the minimum and maximum of each column (NaN: none)."""

    index: np.ndarray
    first_s: np.ndarray
    last_s: np.ndarray
    count: np.ndarray
    low: Sequence[np.ndarray]
    high: Sequence[np.ndarray]

    def only(self, keep: np.ndarray, count: np.ndarray, low: Sequence[np.ndarray],
             high: Sequence[np.ndarray]) -> Buckets:
        """The buckets where `keep`, with other columns (one metric of several sharing the bucket times)."""
        return Buckets(self.index[keep], self.first_s[keep], self.last_s[keep], count[keep],
                       [c[keep] for c in low], [c[keep] for c in high])


def merged_points(b: Buckets, factor: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Buckets merged `factor` at a time, as plot points: each merged bucket's minima at its first timestamp, then
    its maxima at its last timestamp when it holds more than one row. Returns (ts, one value array per column);
    a column with no value in a bucket gives NaN there."""
    keep = b.count > 0
    if not keep.all():
        b = b.only(keep, b.count, b.low, b.high)
    if b.index.size == 0:
        return np.empty(0), [np.empty(0) for _ in b.low]
    group = b.index // factor
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ends = np.r_[starts[1:], group.size] - 1
    two = np.add.reduceat(b.count, starts) > 1
    order = np.ones(2 * starts.size, dtype=bool)
    order[1::2] = two  # per merged bucket: its low point, then its high point if it has two

    def interleave(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        out = np.empty(2 * lo.size)
        out[0::2], out[1::2] = lo, hi
        return out[order]

    ts = interleave(b.first_s[starts], b.last_s[ends])
    with np.errstate(invalid="ignore"):  # fmin/fmax skip NaN; all-NaN stays NaN
        values = [interleave(np.fmin.reduceat(lo, starts), np.fmax.reduceat(hi, starts))
                  for lo, hi in zip(b.low, b.high, strict=True)]
    return ts, values
