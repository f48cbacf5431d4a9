"""Series the dashboard draws that the core API does not serve.

- GET /api/v1/fleet/timeline: utilization heatmap node×GPU×hour and fleet energy per hour (operators);
- GET /api/v1/fleet/headroom: memory headroom of each job active in the window (operators);
- GET /api/v1/jobs/{job_id}/steps: per-step wall time and allocator peaks, for the job page (job readers).

Everything here reads the hourly rollups, the stored reports or the framework steps: nothing is recomputed.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from server.deps import JobReaderAuth, OperatorAuth, SessionDep
from server.errors import InvalidInput
from server.fleet.router import parse_window
from server.jobs import service as job_service
from server.models import Gpu, GpuHourly, Job, Node, Report
from server.models.base import from_epoch, to_epoch
from server.models.framework import JobStep

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])
jobs_router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

MAX_HEATMAP_ROWS = 5000


@router.get("/timeline", summary="Per-GPU utilization by hour (heatmap) and fleet energy by hour")
def fleet_timeline(_: OperatorAuth, session: SessionDep,
                   window: str = Query("24h", description="e.g. 6h, 24h, 7d")) -> dict[str, Any]:
    now = time.time()
    start = now - parse_window(window)
    start -= start % 3600  # the hour the window starts in is drawn whole
    rows = session.execute(
        select(Node.name, Gpu.index, Gpu.uuid, GpuHourly.hour, GpuHourly.util_mean_pct, GpuHourly.energy_j)
        .select_from(GpuHourly).join(Gpu, Gpu.id == GpuHourly.gpu_id).join(Node, Node.id == Gpu.node_id)
        .where(GpuHourly.hour >= from_epoch(start)).order_by(Node.name, Gpu.index, GpuHourly.hour)
    ).all()
    hours = sorted({to_epoch(r[3]) for r in rows})
    col = {h: i for i, h in enumerate(hours)}
    gpus: list[dict[str, Any]] = []
    row_of: dict[str, int] = {}
    util: list[list[float | None]] = []
    energy: list[float | None] = [None] * len(hours)
    energy_gpus = [0] * len(hours)
    for node, index, uuid, hour, util_pct, energy_j in rows:
        if uuid not in row_of:
            row_of[uuid] = len(gpus)
            gpus.append({"node": node, "index": index, "uuid": uuid})
            util.append([None] * len(hours))
        c = col[to_epoch(hour)]
        util[row_of[uuid]][c] = util_pct
        if energy_j is not None:
            energy[c] = (energy[c] or 0.0) + energy_j
            energy_gpus[c] += 1
    truncated = len(gpus) > MAX_HEATMAP_ROWS
    return {
        "window_s": parse_window(window), "generated_at": now, "hours": hours,
        "gpus": gpus[:MAX_HEATMAP_ROWS], "gpu_util_mean_pct": util[:MAX_HEATMAP_ROWS], "truncated": truncated,
        "energy_j": energy, "energy_gpus": energy_gpus,
        "sources": {"gpu_util_mean_pct": "gpu_hourly rollups: hourly mean of NVML gpu_util_pct",
                    "energy_j": "gpu_hourly rollups: integrated power (hourly mean power x covered time)"},
    }


@router.get("/headroom", summary="Memory headroom of each job active in the window (from job reports)")
def fleet_headroom(_: OperatorAuth, session: SessionDep,
                   window: str = Query("24h", description="e.g. 6h, 24h, 7d"),
                   limit: int = Query(5000, ge=1, le=50_000)) -> dict[str, Any]:
    since = from_epoch(time.time() - parse_window(window))
    rows = session.execute(
        select(Job.job_id, Job.team, Report.data).join(Report, Report.job_pk == Job.id)
        .where((Job.ended_at.is_(None)) | (Job.ended_at >= since)).order_by(Job.id.desc()).limit(limit)
    ).all()
    jobs = []
    for job_id, team, data in rows:
        mem = data.get("memory") or {}
        jobs.append({"job_id": job_id, "team": team, "peak_used_bytes": mem.get("peak_used_bytes"),
                     "memory_total_bytes": mem.get("memory_total_bytes"), "headroom_bytes": mem.get("headroom_bytes"),
                     "gpu_count": len(data.get("gpus") or [])})
    return {"window_s": parse_window(window), "jobs": jobs,
            "source": "job reports: largest single-GPU NVML peak vs that GPU's capacity"}


@jobs_router.get("/{job_id}/steps", summary="Per-step wall time and allocator peaks from the framework hooks",
                 responses={404: {"description": "no such job, or not visible to this token"}})
def job_steps(job_id: str, principal: JobReaderAuth, session: SessionDep, since: float | None = None,
              until: float | None = None, limit: int = Query(20_000, ge=1, le=200_000)) -> dict[str, Any]:
    for name, value in (("since", since), ("until", until)):
        if value is not None and not (0 <= value < 1e11):
            raise InvalidInput(f"{name} must be seconds since epoch")
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    stmt = select(JobStep).where(JobStep.job_pk == job.id)
    if since is not None:
        stmt = stmt.where(JobStep.ts >= from_epoch(since))
    if until is not None:
        stmt = stmt.where(JobStep.ts <= from_epoch(until))
    # The most recent `limit` steps, returned in time order.
    steps = list(session.scalars(stmt.order_by(JobStep.ts.desc()).limit(limit)))[::-1]
    return {
        "job_id": job.job_id, "count": len(steps),
        "rank": [s.rank for s in steps], "step": [s.step for s in steps], "ts": [to_epoch(s.ts) for s in steps],
        "wall_s": [s.wall_s for s in steps], "allocated_peak_bytes": [s.allocated_peak_bytes for s in steps],
        "reserved_peak_bytes": [s.reserved_peak_bytes for s in steps],
        "memory_source": next((s.memory_source for s in steps if s.memory_source), None),
        "source": "framework hooks (per-step wall time; torch.cuda max_memory_allocated/reserved per step)",
    }
