"""Stored plot views: a finished job's plot series at the fine bucket grid (server.analysis.base.buckets), written with
its final report. A finished job is viewed many times and never changes, yet each unzoomed view of its page
scanned every sample (8 GPUs x 24 h at 1 Hz: 691,200 rows) and every step; merged from the stored buckets the
same points cost a few milliseconds. Zoomed views, and anything the stored grid cannot answer exactly (a budget
above the raw sample count, a GPU window that changed since), are read from the samples as before.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.analysis.base.buckets import Buckets, bucket_factors, fine_width_us
from server.db import dialect_insert, read_in_parallel
from server.jobs.plot_series import (
    STEP_COLUMNS,
    Series,
    gpu_buckets,
    series_from_buckets,
    step_buckets,
    step_memory_source,
    steps_from_buckets,
    wall_histogram,
)
from server.lru import LruCache
from server.models import Gpu, Job, JobStep, PlotView
from server.models.base import to_epoch

# The job page's series; other metrics are read from the samples.
STORED_METRICS = ("memory_used_bytes", "power_w", "gpu_util_pct")
# Stored as: MAGIC, the JSON header's length (4 bytes, big-endian), the JSON header (what lies where), then every
# array as float64 end to end, zlib-compressed in one piece. (numpy's .npz, one zip member per array, spent
# ~40 ms parsing ~250 member headers per read: more than merging the buckets.)
MAGIC = b"FPV3"  # bumped whenever the bucket grid or the layout changes: older views are then ignored
# Decoded views of the last few jobs opened, keyed by (database, job_pk, computed_at): a job page asks for its
# series and its steps at once, and is opened again; each decode is a ~5 MB inflate. Bounded in bytes.
_DECODED: LruCache[tuple[str, int, datetime], PlotViews] = LruCache(max_entries=4)
_DECODED_MAX_BYTES = 16 * 2**20


@dataclass(frozen=True)
class PlotViews:
    """A job's stored views: per GPU id its window (epoch s) and per-metric fine buckets; the steps' window, their
    per-rank fine buckets, the unzoomed step-time histogram and the allocator's memory source."""

    computed_at: datetime
    gpus: dict[int, tuple[float, float, dict[str, Buckets]]]
    steps: tuple[float, float, dict[int, Buckets]] | None
    histogram: dict[str, Any] | None
    memory_source: str | None
    nbytes: int = 0  # decoded size

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
    meta: dict[str, Any] = {"gpus": [], "steps": None}
    for gpu, start, end, read in reads:
        _put(arrays, f"g{gpu.id}", read.result())
        meta["gpus"].append({"id": gpu.id, "start": to_epoch(start), "end": to_epoch(end)})
    if first is not None:
        per_rank = step_buckets(session, where, first, fine_width_us((last - first).total_seconds()))
        for rank, b in per_rank.items():
            _put(arrays, f"r{rank}", {"steps": b})
        meta["steps"] = {"start": to_epoch(first), "end": to_epoch(last), "ranks": sorted(per_rank)}
    meta["histogram"] = histogram.result()
    meta["memory_source"] = step_memory_source(session, where)
    layout, parts, offset = {}, [], 0
    for key, arr in arrays.items():
        layout[key] = (offset, int(arr.size))
        parts.append(np.asarray(arr, dtype=np.float64))
        offset += arr.size
    meta["layout"] = layout
    header = json.dumps(meta).encode()
    body = np.concatenate(parts).tobytes() if parts else b""
    data = MAGIC + struct.pack(">I", len(header)) + header + zlib.compress(body, 1)
    ins = dialect_insert(session)
    stmt = ins(PlotView).values(job_pk=job.id, computed_at=computed_at, data=data)
    session.execute(stmt.on_conflict_do_update(index_elements=["job_pk"], set_={
        "computed_at": stmt.excluded.computed_at, "data": stmt.excluded.data}))


def _put(arrays: dict[str, np.ndarray], key: str, buckets: dict[str, Buckets]) -> None:
    for name, b in buckets.items():
        k = f"{key}.{name}"
        arrays[f"{k}.index"], arrays[f"{k}.first"], arrays[f"{k}.last"], arrays[f"{k}.n"] = (
            b.index, b.first_s, b.last_s, b.count)
        for i, (lo, hi) in enumerate(zip(b.low, b.high, strict=True)):
            arrays[f"{k}.lo{i}"], arrays[f"{k}.hi{i}"] = lo, hi


# ------------------------------------------------------------------------------------------------ reading


def load(session: Session, job: Job) -> PlotViews | None:
    """The job's stored views, or None (none stored, or stored in another format)."""
    computed_at = session.scalar(select(PlotView.computed_at).where(PlotView.job_pk == job.id))
    if computed_at is None:
        return None
    key = (str(session.get_bind().engine.url), job.id, computed_at)
    views = _DECODED.get(key)
    if views is None:
        data = session.scalar(select(PlotView.data).where(PlotView.job_pk == job.id,
                                                          PlotView.computed_at == computed_at))
        views = decode(data, computed_at) if data is not None else None
        if views is not None and views.nbytes <= _DECODED_MAX_BYTES:
            _DECODED.put(key, views)
    return views


def decode(data: bytes, computed_at: datetime) -> PlotViews | None:
    if data[:len(MAGIC)] != MAGIC:
        return None
    (n,) = struct.unpack(">I", data[len(MAGIC):len(MAGIC) + 4])
    meta = json.loads(data[len(MAGIC) + 4:len(MAGIC) + 4 + n])
    flat = np.frombuffer(zlib.decompress(data[len(MAGIC) + 4 + n:]), dtype=np.float64)
    arrays = {key: flat[offset:offset + size] for key, (offset, size) in meta["layout"].items()}
    gpus = {g["id"]: (g["start"], g["end"], _get(arrays, f"g{g['id']}", STORED_METRICS, 1)) for g in meta["gpus"]}
    steps = None
    if meta["steps"] is not None:
        s = meta["steps"]
        steps = (s["start"], s["end"], {rank: _get(arrays, f"r{rank}", ("steps",), len(STEP_COLUMNS))["steps"]
                                        for rank in s["ranks"]})
    return PlotViews(computed_at=computed_at, gpus=gpus, steps=steps, histogram=meta["histogram"],
                     memory_source=meta["memory_source"], nbytes=flat.nbytes)


def _get(arrays: dict[str, np.ndarray], key: str, names: tuple[str, ...], columns: int) -> dict[str, Buckets]:
    def a(suffix: str) -> np.ndarray:
        return arrays[f"{key}.{suffix}"]

    return {name: Buckets(a(f"{name}.index").astype(np.int64), a(f"{name}.first"), a(f"{name}.last"),
                          a(f"{name}.n").astype(np.int64), [a(f"{name}.lo{i}") for i in range(columns)],
                          [a(f"{name}.hi{i}") for i in range(columns)]) for name in names}
