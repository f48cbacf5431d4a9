"""Fleet rollups and the fleet summary. The definitions live in server.analysis.fleet (pure, validated on real
cluster series); this module only moves data between Postgres and those functions.

- `rollup_hours`: raw samples of the touched hours -> `hourly_rollup` per GPU -> `gpu_hourly` (replaced).
- `summary`: `gpu_hourly` summed per GPU in SQL (so 10,000 GPUs x 24 h is one GROUP BY, not 240,000 rows in
  Python), latest utilization per GPU, and per-job rows from cached reports -> `fleet_summary`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from sqlalchemy import and_, delete, func, select
from sqlalchemy.orm import Session

from server.analysis.fleet import ROLLUP_FIELDS, fleet_summary, hourly_rollup, job_fleet_row
from server.ingest.bulk import insert_ignore
from server.jobs.report_service import epoch_column
from server.models import Gpu, GpuHourly, GpuSample, Job, Node, Report
from server.models.base import from_epoch

HOUR_S = 3600.0
CURRENT_WINDOW_S = 300.0  # a GPU's "now" is its latest sample within this window
# One interval past the end is read so that the last interval of the last hour has its closing sample.
LOOKAHEAD_S = 120.0


def rollup_hours(session: Session, *, since: float, until: float) -> int:
    """(Re)compute gpu_hourly for the hours in [floor(since), ceil(until)). Idempotent."""
    h0 = since - since % HOUR_S
    h1 = until - until % HOUR_S + HOUR_S
    t = GpuSample.__table__
    rows = session.execute(
        select(t.c.gpu_id, epoch_column(session, t.c.ts), t.c.gpu_util_pct,
               func.coalesce(t.c.memory_used_max_bytes, t.c.memory_used_bytes), t.c.power_w, t.c.energy_counter_j)
        .where(t.c.ts >= from_epoch(h0), t.c.ts < from_epoch(h1 + LOOKAHEAD_S)).order_by(t.c.gpu_id, t.c.ts)
    ).all()
    session.execute(delete(GpuHourly).where(GpuHourly.hour >= from_epoch(h0), GpuHourly.hour < from_epoch(h1)))
    if not rows:
        return 0
    a = np.array(rows, dtype=np.float64)
    names = ["gpu_id", "hour", *ROLLUP_FIELDS[1:]]
    columns: list[list[Any]] = [[] for _ in names]
    bounds = np.flatnonzero(np.diff(a[:, 0])) + 1
    for part in np.split(a, bounds):
        r = hourly_rollup(part[:, 1], gpu_util_pct=part[:, 2], memory_used_bytes=part[:, 3], power_w=part[:, 4],
                          energy_counter_j=part[:, 5])
        keep = (r["hour_start"] >= h0) & (r["hour_start"] < h1)
        n = int(keep.sum())
        columns[0].extend([int(part[0, 0])] * n)
        columns[1].extend(r["hour_start"][keep].tolist())
        for i, field in enumerate(ROLLUP_FIELDS[1:], start=2):
            values = r[field][keep]
            if field in ("samples", "memory_peak_bytes"):
                columns[i].extend(None if np.isnan(v) else int(v) for v in values)
            else:
                columns[i].extend(None if np.isnan(v) else float(v) for v in values)
    db_names = [{"hour_start": "hour"}.get(n, n) for n in names]
    return insert_ignore(session, GpuHourly.__table__, db_names, columns, time_columns=frozenset({"hour"}))


def _latest_util(session: Session, now: float) -> dict[str, float | None]:
    latest = (select(GpuSample.gpu_id, func.max(GpuSample.ts).label("ts"))
              .where(GpuSample.ts >= from_epoch(now - CURRENT_WINDOW_S)).group_by(GpuSample.gpu_id).subquery())
    rows = session.execute(
        select(Node.name, Gpu.uuid, GpuSample.gpu_util_pct)
        .join(latest, and_(GpuSample.gpu_id == latest.c.gpu_id, GpuSample.ts == latest.c.ts))
        .join(Gpu, Gpu.id == GpuSample.gpu_id).join(Node, Node.id == Gpu.node_id)
    ).all()
    return {f"{node}/{uuid}": util for node, uuid, util in rows}


def summary(session: Session, *, window_s: float, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    start = now - window_s
    hour0 = start - start % HOUR_S  # hours *starting* in the window, as fleet_summary counts them
    per_gpu = session.execute(
        select(GpuHourly.gpu_id, func.count(), func.sum(GpuHourly.covered_s), func.sum(GpuHourly.busy_s),
               func.sum(GpuHourly.util_busy_s), func.sum(GpuHourly.energy_j), func.max(GpuHourly.memory_peak_bytes),
               func.sum(GpuHourly.samples))
        .where(GpuHourly.hour >= from_epoch(hour0 if hour0 >= start else hour0 + HOUR_S))
        .group_by(GpuHourly.gpu_id)
    ).all()
    # One pseudo-rollup row per GPU, stamped at the window start: fleet_summary sums these like hour rows.
    rollups: dict[str, Any] = {
        "gpu_uuid": np.array([str(r[0]) for r in per_gpu], dtype=object),
        "hour_start": np.full(len(per_gpu), max(start, hour0)),
        "covered_s": np.array([r[2] or 0.0 for r in per_gpu], dtype=np.float64),
        "busy_s": np.array([np.nan if r[3] is None else r[3] for r in per_gpu], dtype=np.float64),
        "util_busy_s": np.array([np.nan if r[4] is None else r[4] for r in per_gpu], dtype=np.float64),
        "energy_j": np.array([np.nan if r[5] is None else r[5] for r in per_gpu], dtype=np.float64),
    }
    since = from_epoch(start)
    reports = session.execute(
        select(Report.data).join(Job, Job.id == Report.job_pk)
        .where((Job.ended_at.is_(None)) | (Job.ended_at >= since))
    ).scalars().all()
    out = fleet_summary(rollups, now=now, window_s=window_s + HOUR_S, current_util_pct=_latest_util(session, now),
                        jobs=[job_fleet_row(r) for r in reports])
    out["window_s"] = window_s
    out["generated_at"] = now
    out["gpus_total"] = session.scalar(select(func.count()).select_from(Gpu)) or 0
    out["sources"] = {
        "gpu_hours": "hourly rollups of NVML samples (sample-and-hold time)",
        "busy_gpu_hours": "time with gpu_util_pct >= idle threshold",
        "energy_j": "hardware energy counter deltas, else integrated power, per rollup hour",
        "memory_stranded_bytes": "job reports: GPU capacity - NVML peak used, summed over jobs in the window",
    }
    return out
