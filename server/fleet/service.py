"""Fleet rollups (hourly per GPU, kept after raw samples expire) and the fleet summary built on them."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import and_, case, func, literal_column, select
from sqlalchemy.orm import Session

from server.db import is_postgres
from server.ingest.bulk import insert_ignore
from server.models import Gpu, GpuHourly, GpuSample, Job, Node, Report
from server.models.base import from_epoch

BUSY_UTIL_PCT = 5.0  # a GPU sample counts as busy at or above this utilization
IDLE_NOW_WINDOW_S = 300.0


def _hour_expr(session: Session):  # type: ignore[no-untyped-def]
    if is_postgres(session):
        return literal_column("extract(epoch from date_trunc('hour', gpu_samples.ts))::float8")
    return func.floor((func.julianday(GpuSample.ts) - 2440587.5) * 24.0) * 3600.0


def _epoch(session: Session, col):  # type: ignore[no-untyped-def]
    if is_postgres(session):
        return literal_column(f"extract(epoch from {col})::float8")
    return (func.julianday(GpuSample.ts) - 2440587.5) * 86400.0


def rollup_hours(session: Session, *, since: float, until: float) -> int:
    """(Re)compute gpu_hourly for every hour touching [since, until). Idempotent: rows are replaced."""
    start = from_epoch(since - since % 3600)
    end = from_epoch(until - until % 3600 + 3600)
    hour = _hour_expr(session).label("hour")
    ts = _epoch(session, "gpu_samples.ts")
    mem = func.coalesce(GpuSample.memory_used_max_bytes, GpuSample.memory_used_bytes)
    rows = session.execute(
        select(GpuSample.gpu_id, hour, func.count(), func.sum(case((GpuSample.gpu_util_pct >= BUSY_UTIL_PCT, 1),
                                                                    else_=0)),
               func.avg(GpuSample.gpu_util_pct), func.max(mem), func.avg(GpuSample.memory_used_bytes),
               func.avg(GpuSample.power_w), func.min(ts), func.max(ts))
        .where(GpuSample.ts >= start, GpuSample.ts < end).group_by(GpuSample.gpu_id, hour)
    ).all()
    session.query(GpuHourly).filter(GpuHourly.hour >= start, GpuHourly.hour < end).delete()
    cols: list[list[Any]] = [[] for _ in range(9)]
    for gpu_id, hour_s, n, busy, util, mem_max, mem_mean, power, t0, t1 in rows:
        # Covered time: the span of the samples plus one mean interval (n samples cover n intervals).
        covered = (t1 - t0) * n / (n - 1) if n > 1 else None
        energy = power * covered if power is not None and covered is not None else None
        for i, v in enumerate((gpu_id, float(hour_s), int(n), int(busy or 0), util,
                               None if mem_max is None else int(mem_max), mem_mean, power, energy)):
            cols[i].append(v)
    return insert_ignore(session, GpuHourly.__table__,
                         ["gpu_id", "hour", "samples", "busy_samples", "gpu_util_mean_pct", "memory_used_max_bytes",
                          "memory_used_mean_bytes", "power_mean_w", "energy_j"], cols, time_columns=frozenset({"hour"}))


def summary(session: Session, *, window_s: float, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    since = from_epoch(now - window_s)
    hourly = session.execute(
        select(func.count(func.distinct(GpuHourly.gpu_id)), func.sum(GpuHourly.samples),
               func.sum(GpuHourly.busy_samples), func.sum(GpuHourly.energy_j))
        .where(GpuHourly.hour >= since)
    ).one()
    gpus_reporting, samples, busy, energy = hourly
    gpus_total = session.scalar(select(func.count()).select_from(Gpu)) or 0
    # Sample counts become GPU-hours through each GPU's interval: approximated here as 1 s (the agent default)
    # unless the rollup's covered time says otherwise.
    covered = session.execute(
        select(func.sum(GpuHourly.energy_j / GpuHourly.power_mean_w)).where(GpuHourly.hour >= since,
                                                                           GpuHourly.power_mean_w > 0)
    ).scalar()
    interval_s = (covered / samples) if covered and samples else 1.0
    gpu_hours = (samples or 0) * interval_s / 3600.0
    busy_hours = (busy or 0) * interval_s / 3600.0

    latest = (select(GpuSample.gpu_id, func.max(GpuSample.ts).label("ts"))
              .where(GpuSample.ts >= from_epoch(now - IDLE_NOW_WINDOW_S)).group_by(GpuSample.gpu_id).subquery())
    idle_now = session.execute(
        select(Node.name, Gpu.index, Gpu.uuid, Gpu.name)
        .join(latest, and_(GpuSample.gpu_id == latest.c.gpu_id, GpuSample.ts == latest.c.ts))
        .join(Gpu, Gpu.id == GpuSample.gpu_id).join(Node, Node.id == Gpu.node_id)
        .where((GpuSample.gpu_util_pct < BUSY_UTIL_PCT) | GpuSample.gpu_util_pct.is_(None))
    ).all()

    stranded = 0
    wasteful = []
    reports = session.execute(
        select(Job.job_id, Job.team, Report.data).join(Report, Report.job_pk == Job.id)
        .where((Job.ended_at.is_(None)) | (Job.ended_at >= since))
    ).all()
    for job_id, team, data in reports:
        job_stranded = 0
        for g in data.get("gpus") or []:
            total, peak = g.get("memory_total_bytes"), g.get("peak_used_bytes")
            if total is not None and peak is not None:
                job_stranded += max(0, total - peak)
        stranded += job_stranded
        util = (data.get("utilization") or {}).get("gpu_mean_pct")
        idle_j = (data.get("energy") or {}).get("idle_energy_j")
        wasteful.append({"job_id": job_id, "team": team, "stranded_memory_bytes": job_stranded,
                         "gpu_mean_pct": util, "idle_energy_j": idle_j,
                         "gpu_count": len(data.get("gpus") or [])})
    wasteful.sort(key=lambda j: ((100 - (j["gpu_mean_pct"] or 0)) * j["gpu_count"], j["stranded_memory_bytes"]),
                  reverse=True)
    return {
        "window_s": window_s, "generated_at": now,
        "gpus_total": gpus_total, "gpus_reporting": gpus_reporting or 0,
        "gpu_hours": gpu_hours, "busy_gpu_hours": busy_hours,
        "busy_fraction": (busy_hours / gpu_hours) if gpu_hours else None,
        "idle_gpus_now": len(idle_now),
        "idle_gpus": [{"node": n, "index": i, "uuid": u, "name": m} for n, i, u, m in idle_now[:100]],
        "energy_j": energy, "energy_source": "integrated_power (hourly mean power x covered time)",
        "stranded_memory_bytes": stranded,
        "most_wasteful_jobs": wasteful[:10],
        "sources": {"gpu_hours": "gpu_hourly rollups", "stranded_memory_bytes": "job reports (NVML peak vs capacity)"},
    }

