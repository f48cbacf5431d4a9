"""A job's series as the plots draw them: per-GPU telemetry and per-rank framework steps bucketed in SQL on the
grid of server.analysis.base.buckets (minima at each bucket's first timestamp, maxima at its last), and the step-time
histogram. Reads for /timeseries, /timeseries/batch and /steps, and for the stored plot views
(server.jobs.plot_views), which hold the same buckets at the fine grid.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Float, case, cast, extract, func, literal_column, select
from sqlalchemy.orm import Session

from server.analysis.base.buckets import SLACK_US, Buckets, bucket_factors, fine_width_us, merged_points
from server.db import epoch_column, float_rows, is_postgres
from server.models import Gpu, GpuSample, JobStep

STEP_COLUMNS = ("step", "wall_s", "allocated_peak_bytes", "reserved_peak_bytes")
_INTEGRAL_STEP_COLUMNS = {"step", "allocated_peak_bytes", "reserved_peak_bytes"}
HISTOGRAM_BINS = 60


# The grid starts this much before the range: SQLite's epoch seconds (through julianday) are off by up to ~0.2 ms,
# and a sample at the range's first instant must not fall into a bucket of its own before it.
ORIGIN_SLACK = timedelta(microseconds=SLACK_US // 2)


def time_buckets(session: Session, ts: Any, start: datetime, width_us: int) -> Any:
    """The SQL bucket key of `width_us`-microsecond buckets of the range from `start`: the one rule for the time
    buckets of plotted series. Postgres buckets the timestamp itself with date_bin: converting every row to epoch
    seconds first (EXTRACT is numeric since PG 14) cost three times the scan of a 24 h x 1 Hz series."""
    origin = start - ORIGIN_SLACK
    if is_postgres(session):
        return func.date_bin(literal_column(f"interval '{int(width_us)} microseconds'"), ts, origin)
    return func.floor((epoch_column(session, ts) - origin.timestamp()) / (width_us / 1e6))


def first_last(session: Session, ts: Any, where: Any = None) -> tuple[Any, Any]:
    """Aggregates: the first and last timestamp of a bucket's rows (those where `where`, if given), as epoch
    seconds; only the bucket rows are converted."""
    ts = ts if where is None else case((where, ts))
    if is_postgres(session):
        return cast(extract("epoch", func.min(ts)), Float), cast(extract("epoch", func.max(ts)), Float)
    return (func.min(epoch_column(session, ts)), func.max(epoch_column(session, ts)))


def bucket_index(first_s: np.ndarray, start: datetime, width_us: int) -> np.ndarray:
    """Each bucket's index from its first row's time: whole microseconds, as Postgres' date_bin counts them."""
    offset_us = np.rint(first_s * 1e6) - round((start - ORIGIN_SLACK).timestamp() * 1e6)
    return (offset_us // width_us).astype(np.int64)


# ------------------------------------------------------------------------------------------------ GPU series


def gpu_buckets(session: Session, gpu: Gpu, start: datetime, end: datetime, metrics: tuple[str, ...],
                width_us: int) -> dict[str, Buckets]:
    """Per metric, the GPU's buckets of `width_us` in [start, end] that hold a value of it, with the first and
    last time it had one: one scan for every metric (next to reading the rows, more aggregates cost nothing)."""
    t = GpuSample.__table__
    bucket = time_buckets(session, t.c.ts, start, width_us)
    aggs = [a for m in metrics for a in (func.count(t.c[m]), *first_last(session, t.c.ts, t.c[m].is_not(None)),
                                         func.min(t.c[m]), func.max(t.c[m]))]
    stmt = (select(*aggs).where(t.c.gpu_id == gpu.id, t.c.ts >= start, t.c.ts <= end)
            .group_by(bucket).order_by(bucket))
    a = float_rows(session, stmt, 5 * len(metrics))
    out = {}
    for i, m in enumerate(metrics):
        n, first, last, lo, hi = (a[:, 5 * i + j] for j in range(5))
        keep = n > 0
        out[m] = Buckets(bucket_index(first[keep], start, width_us), first[keep], last[keep],
                         n[keep].astype(np.int64), [lo[keep]], [hi[keep]])
    return out


Series = tuple[list[float], list[float], int]  # (ts, values, raw sample count)


def series_from_buckets(buckets: dict[str, Buckets], factors: dict[str, int]) -> dict[str, Series]:
    """Per metric, its points: its buckets merged `factors[metric]` at a time."""
    out = {}
    for m, factor in factors.items():
        ts, (values,) = merged_points(buckets[m], factor)
        out[m] = (ts.tolist(), values.tolist(), int(buckets[m].count.sum()))
    return out


def downsampled_series(session: Session, gpu: Gpu, start: datetime, end: datetime,
                       points: dict[str, int]) -> dict[str, Series]:
    """Per metric: (ts, values, raw count), at most its `points`, bucketed in SQL (extremes survive exactly and a
    24 h x 1 Hz series never travels to Python row by row); a metric with no more samples than its budget comes
    as its samples."""
    factors = bucket_factors(points)
    base = min(factors.values())
    fine_us = fine_width_us((end - start).total_seconds())
    buckets = gpu_buckets(session, gpu, start, end, tuple(points), base * fine_us)
    out = series_from_buckets(buckets, {m: f // base for m, f in factors.items()})
    as_is = [m for m in points if out[m][2] <= points[m]]
    if as_is:
        t = GpuSample.__table__
        samples = session.execute(select(epoch_column(session, t.c.ts), *(t.c[m] for m in as_is))
                                  .where(t.c.gpu_id == gpu.id, t.c.ts >= start, t.c.ts <= end)
                                  .order_by(t.c.ts)).all()
        for i, metric in enumerate(as_is, start=1):
            pairs = [(float(r[0]), float(r[i])) for r in samples if r[i] is not None]
            out[metric] = ([p[0] for p in pairs], [p[1] for p in pairs], len(pairs))
    return out


# ------------------------------------------------------------------------------------------------ steps


def step_buckets(session: Session, where: list[Any], start: datetime, width_us: int) -> dict[int, Buckets]:
    """Per rank, its non-empty buckets of `width_us` from `start` (the STEP_COLUMNS share one row count)."""
    bucket = time_buckets(session, JobStep.__table__.c.ts, start, width_us)
    cols = [getattr(JobStep, c) for c in STEP_COLUMNS]
    stmt = (select(JobStep.rank, *first_last(session, JobStep.__table__.c.ts), func.count(),
                   *(func.min(c) for c in cols),
                   *(func.max(c) for c in cols))
            .where(*where).group_by(JobStep.rank, bucket).order_by(JobStep.rank, bucket))
    a = float_rows(session, stmt, 4 + 2 * len(cols))
    out = {}
    ranks = a[:, 0].astype(np.int64)
    for rank in np.unique(ranks):
        r = a[ranks == rank]
        out[int(rank)] = Buckets(bucket_index(r[:, 1], start, width_us), r[:, 1], r[:, 2], r[:, 3].astype(np.int64),
                                 [r[:, 4 + i] for i in range(len(cols))],
                                 [r[:, 4 + len(cols) + i] for i in range(len(cols))])
    return out


def steps_from_buckets(per_rank: dict[int, Buckets], factor: int) -> dict[str, Any]:
    """The rows /steps?points sends for buckets of `factor` buckets each, rank after rank, with the step count of
    the busiest rank (the caller sends the steps themselves when they fit)."""
    out: dict[str, list[Any]] = {k: [] for k in ("rank", "ts", *STEP_COLUMNS)}
    for rank, b in sorted(per_rank.items()):
        ts, values = merged_points(b, factor)
        out["rank"] += [rank] * ts.size
        out["ts"] += ts.tolist()
        for name, v in zip(STEP_COLUMNS, values, strict=True):
            out[name] += _json_numbers(v, integral=name in _INTEGRAL_STEP_COLUMNS)
    counts = [int(b.count.sum()) for b in per_rank.values()]
    return {"rows": {"count": len(out["ts"]), **out}, "raw_count": sum(counts), "max_per_rank": max(counts, default=0)}


def downsampled_steps(session: Session, where: list[Any], start: datetime, end: datetime,
                      points: int) -> dict[str, Any]:
    """Per rank and time bucket of [start, end], two rows: the bucket's minima at its first step's time, its
    maxima at its last (as /timeseries does), so per-step peaks survive at any zoom."""
    factor = bucket_factors({"steps": points})["steps"]
    width_us = factor * fine_width_us((end - start).total_seconds())
    return steps_from_buckets(step_buckets(session, where, start, width_us), 1)


def step_memory_source(session: Session, where: list[Any]) -> str | None:
    """Where the steps' allocator peaks came from (the hooks say; the first step that says)."""
    return session.scalar(select(JobStep.memory_source).where(*where, JobStep.memory_source.is_not(None)).limit(1))


def wall_histogram(session: Session, where: list[Any]) -> dict[str, Any] | None:
    """Step time of every step in the range (a step's time is its slowest rank's, as the report counts it) as
    HISTOGRAM_BINS equal bins from the fastest step to the 99.5th percentile, the slower ones counted in
    `above`: a few very slow steps (compilation, checkpoints) would otherwise squeeze every other step into one
    bin. One float per step leaves the database (a 24 h job at 2 steps/s: 172,800)."""
    wall = np.array(session.scalars(select(func.max(JobStep.wall_s)).where(*where).group_by(JobStep.step)).all(),
                    dtype=np.float64)
    if wall.size == 0:
        return None
    lo, hi = float(wall.min()), float(wall.max())
    top = min(hi, float(np.quantile(wall, 0.995, method="higher")))
    counts, edges = np.histogram(wall[wall <= top], bins=HISTOGRAM_BINS, range=(lo, top if top > lo else lo + 1.0))
    return {"edges_s": edges.tolist(), "counts": counts.tolist(), "count": int(wall.size),
            "above": int(wall.size - counts.sum()), "max_s": hi, "per": "step (slowest rank)"}


def _json_numbers(values: np.ndarray, *, integral: bool) -> list[Any]:
    """NaN as null; whole-number columns as ints."""
    cast = int if integral else float
    return [None if v != v else cast(v) for v in values.tolist()]
