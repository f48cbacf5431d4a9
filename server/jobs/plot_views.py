"""Stored plot views: a finished job's plot series at the fine bucket grid (server.analysis.buckets), written with
its final report. A finished job is viewed many times and never changes, yet each unzoomed view of its page
scanned every sample (8 GPUs x 24 h at 1 Hz: 691,200 rows) and every step; merged from the stored buckets the
same points cost a few milliseconds. Zoomed views, and anything the stored grid cannot answer exactly (a budget
above the raw sample count, a GPU window that changed since), are read from the samples as before.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from server.analysis.buckets import Buckets, bucket_factors, fine_width_us
from server.db import is_postgres, read_in_parallel
from server.jobs.plot_series import (STEP_COLUMNS, Series, gpu_buckets, series_from_buckets, step_buckets,
                                     steps_from_buckets, wall_histogram)
from server.models import Gpu, Job, JobStep, PlotView
from server.models.base import to_epoch

# The job page's series; other metrics are read from the samples.
STORED_METRICS = ("memory_used_bytes", "power_w", "gpu_util_pct")
FORMAT = 1


@dataclass(frozen=True)
class PlotViews:
    """A job's stored views: per GPU id its window (epoch s) and per-metric fine buckets; the steps' window, their
    per-rank fine buckets, the unzoomed step-time histogram and the allocator's memory source."""

    computed_at: datetime
    gpus: dict[int, tuple[float, float, dict[str, Buckets]]]
    steps: tuple[float, float, dict[int, Buckets]] | None
    histogram: dict[str, Any] | None
    memory_source: str | None

    def series(self, gpu: Gpu, start: datetime, end: datetime, points: dict[str, int]) -> dict[str, Series] | None:
        """The GPU's points for this window and these budgets, as downsampled_series would read them; None when
        the stored grid cannot give them exactly (another window, a metric not stored, or a budget that would
        get the raw samples)."""
        stored = self.gpus.get(gpu.id)
        if stored is None or (stored[0], stored[1]) != (to_epoch(start), to_epoch(end)):
            return None
        buckets = stored[2]
        if any(m not in buckets or int(buckets[m].count.sum()) <= p for m, p in points.items()):
            return None
        return series_from_buckets(buckets, bucket_factors(points))

    def downsampled_steps(self, points: int) -> dict[str, Any] | None:
        """The unzoomed /steps?points rows, or None when the busiest rank's steps fit the budget (sent as they are)."""
        if self.steps is None:
            return None
        per_rank = self.steps[2]
        if max((int(b.count.sum()) for b in per_rank.values()), default=0) <= points:
            return None
        return steps_from_buckets(per_rank, bucket_factors({"steps": points})["steps"])


# ------------------------------------------------------------------------------------------------ writing


def store(session: Session, job: Job, windows: list[tuple[Gpu, datetime, datetime]], *, computed_at: datetime) -> None:
    """Read the job's fine buckets (each GPU on a connection of its own) and store them, replacing older ones."""
    reads = [(gpu, start, end, read_in_parallel(session, gpu_buckets, gpu, start, end, STORED_METRICS,
                                                fine_width_us((end - start).total_seconds())))
             for gpu, start, end in windows if end >= start]
    where = [JobStep.job_pk == job.id]
    histogram = read_in_parallel(session, wall_histogram, where)
    first, last = session.execute(select(func.min(JobStep.ts), func.max(JobStep.ts)).where(*where)).one()
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"format": FORMAT, "gpus": [], "steps": None}
    for gpu, start, end, read in reads:
        _put(arrays, f"g{gpu.id}", read.result())
        meta["gpus"].append({"id": gpu.id, "start": to_epoch(start), "end": to_epoch(end)})
    if first is not None:
        per_rank = step_buckets(session, where, first, fine_width_us((last - first).total_seconds()))
        for rank, b in per_rank.items():
            _put(arrays, f"r{rank}", {"steps": b})
        meta["steps"] = {"start": to_epoch(first), "end": to_epoch(last), "ranks": sorted(per_rank)}
    meta["histogram"] = histogram.result()
    meta["memory_source"] = session.scalar(select(JobStep.memory_source).where(
        *where, JobStep.memory_source.is_not(None)).limit(1))
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **arrays)
    ins = pg_insert if is_postgres(session) else sqlite_insert
    stmt = ins(PlotView).values(job_pk=job.id, computed_at=computed_at, data=buf.getvalue())
    session.execute(stmt.on_conflict_do_update(index_elements=["job_pk"], set_={
        "computed_at": stmt.excluded.computed_at, "data": stmt.excluded.data}))


def _put(arrays: dict[str, np.ndarray], key: str, buckets: dict[str, Buckets]) -> None:
    for name, b in buckets.items():
        k = f"{key}.{name}"
        arrays[f"{k}.index"], arrays[f"{k}.first"], arrays[f"{k}.last"], arrays[f"{k}.n"] = (
            b.index, b.first_s, b.last_s, b.count)
        for i, (lo, hi) in enumerate(zip(b.low, b.high)):
            arrays[f"{k}.lo{i}"], arrays[f"{k}.hi{i}"] = lo, hi


# ------------------------------------------------------------------------------------------------ reading


def load(session: Session, job: Job) -> PlotViews | None:
    """The job's stored views, or None (none stored, or stored in an older format)."""
    row = session.get(PlotView, job.id)
    if row is None:
        return None
    with np.load(io.BytesIO(row.data), allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("format") != FORMAT:
            return None
        gpus = {g["id"]: (g["start"], g["end"], _get(z, f"g{g['id']}", STORED_METRICS, 1)) for g in meta["gpus"]}
        steps = None
        if meta["steps"] is not None:
            s = meta["steps"]
            steps = (s["start"], s["end"], {rank: _get(z, f"r{rank}", ("steps",), len(STEP_COLUMNS))["steps"]
                                            for rank in s["ranks"]})
    return PlotViews(computed_at=row.computed_at, gpus=gpus, steps=steps, histogram=meta["histogram"],
                     memory_source=meta["memory_source"])


def _get(z: Any, key: str, names: tuple[str, ...], columns: int) -> dict[str, Buckets]:
    return {name: Buckets(z[f"{key}.{name}.index"], z[f"{key}.{name}.first"], z[f"{key}.{name}.last"],
                          z[f"{key}.{name}.n"], [z[f"{key}.{name}.lo{i}"] for i in range(columns)],
                          [z[f"{key}.{name}.hi{i}"] for i in range(columns)]) for name in names}
