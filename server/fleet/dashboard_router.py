"""Series the dashboard draws that the core API does not serve.

- GET /api/v1/fleet/timeline: utilization heatmap node×GPU×hour and fleet energy per hour, by energy source
  (operators);
- GET /api/v1/fleet/headroom: memory headroom of each job active in the window (operators);
- GET /api/v1/jobs/{job_id}/steps: per-step wall time and allocator peaks, for the job page (job readers); with
  `points`, downsampled to the plot's width plus a step-time histogram of every step.

Everything here reads the hourly rollups, the stored reports or the framework steps: nothing is recomputed.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Query, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.analysis.fleet import ENERGY_SOURCES
from server.deps import JobReaderAuth, OperatorAuth, SessionDep
from server.errors import InvalidInput
from server.fleet import service as fleet_service
from server.fleet.router import parse_window
from server.jobs import service as job_service
from server.jobs.report_service import bucket_width_s, time_buckets
from server.models import Gpu, GpuHourly, Node
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
        select(Node.name, Gpu.index, Gpu.uuid, GpuHourly.hour, GpuHourly.util_mean_pct, GpuHourly.energy_j,
               GpuHourly.energy_source)
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
    # Joules per hour by where they came from; "unrecorded": a rollup written before its source was recorded.
    by_source: dict[str, list[float | None]] = {}
    for node, index, uuid, hour, util_pct, energy_j, source in rows:
        if uuid not in row_of:
            row_of[uuid] = len(gpus)
            gpus.append({"node": node, "index": index, "uuid": uuid})
            util.append([None] * len(hours))
        c = col[to_epoch(hour)]
        util[row_of[uuid]][c] = util_pct
        if energy_j is not None:
            energy[c] = (energy[c] or 0.0) + energy_j
            energy_gpus[c] += 1
            per_hour = by_source.setdefault(source or "unrecorded", [None] * len(hours))
            per_hour[c] = (per_hour[c] or 0.0) + energy_j
    truncated = len(gpus) > MAX_HEATMAP_ROWS
    return {
        "window_s": parse_window(window), "generated_at": now, "hours": hours,
        "gpus": gpus[:MAX_HEATMAP_ROWS], "gpu_util_mean_pct": util[:MAX_HEATMAP_ROWS], "truncated": truncated,
        "energy_j": energy, "energy_gpus": energy_gpus,
        "energy_by_source_j": {k: by_source[k] for k in ENERGY_SOURCES if k in by_source},
        "energy_source": [_hour_source([v[c] for v in by_source.values()], list(by_source)) for c in range(len(hours))],
        "sources": {"gpu_util_mean_pct": "gpu_hourly rollups: hourly mean of NVML gpu_util_pct",
                    "energy_j": "gpu_hourly rollups: NVML total-energy counter deltas where the GPU has the counter, "
                                "else integrated power; energy_source (per hour) and energy_by_source_j say which"},
    }


def _hour_source(values: list[float | None], names: list[str]) -> str | None:
    """The one source of an hour's energy, "mixed" when several contributed, None when the hour has none."""
    present = {n for n, v in zip(names, values) if v is not None}
    if not present:
        return None
    return present.pop() if len(present) == 1 else "mixed"


@router.get("/headroom", summary="Memory headroom of each job active in the window (from job reports)")
def fleet_headroom(_: OperatorAuth, session: SessionDep,
                   window: str = Query("24h", description="e.g. 6h, 24h, 7d"),
                   limit: int = Query(5000, ge=1, le=50_000)) -> dict[str, Any]:
    since = from_epoch(time.time() - parse_window(window))
    jobs = [{"job_id": r["job_id"], "team": r["team"], "peak_used_bytes": r["peak_used_bytes"],
             "memory_total_bytes": r["memory_total_bytes"], "headroom_bytes": r["headroom_bytes"],
             "gpu_count": r["gpus"]} for r in fleet_service.job_rows(session, since, limit=limit)]
    return {"window_s": parse_window(window), "jobs": jobs,
            "source": "job reports: largest single-GPU NVML peak vs that GPU's capacity"}


@jobs_router.get("/{job_id}/steps", summary="Per-step wall time and allocator peaks from the framework hooks",
                 responses={404: {"description": "no such job, or not visible to this token"}})
def job_steps(job_id: str, principal: JobReaderAuth, session: SessionDep, since: float | None = None,
              until: float | None = None, limit: int = Query(20_000, ge=1, le=200_000),
              points: int | None = Query(None, ge=10, le=20_000, description=(
                  "downsample to about this many rows per rank (each time bucket's minima at its first step, "
                  "maxima at its last) and add a step-time histogram of every step in the range"))) -> Response:
    for name, value in (("since", since), ("until", until)):
        if value is not None and not (0 <= value < 1e11):
            raise InvalidInput(f"{name} must be seconds since epoch")
    job = job_service.get_visible_job(session, job_id=job_id, principal=principal)
    where = [JobStep.job_pk == job.id]
    if since is not None:
        where.append(JobStep.ts >= from_epoch(since))
    if until is not None:
        where.append(JobStep.ts <= from_epoch(until))
    meta = {"job_id": job.job_id,
            "memory_source": session.scalar(select(JobStep.memory_source).where(*where,
                                                                                JobStep.memory_source.is_not(None))
                                            .limit(1)),
            "source": "framework hooks (per-step wall time; torch.cuda max_memory_allocated/reserved per step)"}
    if points is not None:
        meta["wall_s_histogram"] = _wall_histogram(session, where)
        first, last = session.execute(select(func.min(JobStep.ts), func.max(JobStep.ts)).where(*where)).one()
        down = _downsampled_steps(session, where, first, last, points) if first is not None else \
            {"rows": {}, "raw_count": 0, "max_per_rank": 0}
        if down["max_per_rank"] > points:
            return _json({**meta, **down["rows"], "raw_count": down["raw_count"], "downsampled": True})
        limit = max(down["raw_count"], 1)
    # The most recent `limit` steps, returned in time order.
    steps = list(session.scalars(select(JobStep).where(*where).order_by(JobStep.ts.desc()).limit(limit)))[::-1]
    out = {
        **meta, "count": len(steps),
        "rank": [s.rank for s in steps], "step": [s.step for s in steps], "ts": [to_epoch(s.ts) for s in steps],
        "wall_s": [s.wall_s for s in steps], "allocated_peak_bytes": [s.allocated_peak_bytes for s in steps],
        "reserved_peak_bytes": [s.reserved_peak_bytes for s in steps],
    }
    if points is not None:
        out.update(raw_count=len(steps), downsampled=False)
    return _json(out)


def _json(body: dict[str, Any]) -> Response:
    """Tens of thousands of numbers: serialized at once (FastAPI's encoder walks every value, ~4x slower)."""
    return Response(orjson.dumps(body), media_type="application/json")


_STEP_COLUMNS = ("step", "wall_s", "allocated_peak_bytes", "reserved_peak_bytes")


def _downsampled_steps(session: Session, where: list[Any], start: datetime, end: datetime,
                       points: int) -> dict[str, Any]:
    """Per rank and time bucket, two rows: the bucket's minima at its first step's time, its maxima at its last
    (as /timeseries does), so per-step peaks survive at any zoom. Also the step count of the busiest rank, so the
    caller can send the steps themselves when they fit."""
    bucket, first_s, last_s = time_buckets(session, JobStep.ts, start,
                                           bucket_width_s((end - start).total_seconds(), points))
    cols = [getattr(JobStep, c) for c in _STEP_COLUMNS]
    rows = session.execute(
        select(JobStep.rank, bucket.label("b"), func.count(), first_s, last_s,
               *(func.min(c) for c in cols), *(func.max(c) for c in cols))
        .where(*where).group_by(JobStep.rank, "b").order_by(JobStep.rank, "b")).all()
    out: dict[str, list[Any]] = {k: [] for k in ("rank", "ts", *_STEP_COLUMNS)}
    per_rank: dict[int, int] = {}
    n_cols = len(cols)
    for rank, _, n, t_first, t_last, *agg in rows:
        per_rank[rank] = per_rank.get(rank, 0) + n
        for ts, values in ((t_first, agg[:n_cols]), (t_last, agg[n_cols:])) if n > 1 else ((t_first, agg[:n_cols]),):
            out["rank"].append(rank)
            out["ts"].append(float(ts))
            for name, v in zip(_STEP_COLUMNS, values):
                out[name].append(v)
    return {"rows": {"count": len(out["ts"]), **out}, "raw_count": sum(per_rank.values()),
            "max_per_rank": max(per_rank.values(), default=0)}


HISTOGRAM_BINS = 60


def _wall_histogram(session: Session, where: list[Any]) -> dict[str, Any] | None:
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
