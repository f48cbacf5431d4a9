"""Series the dashboard draws that the core API does not serve.

- GET /api/v1/fleet/timeline: utilization heatmap node×GPU×hour and fleet energy per hour, by energy source
  (operators);
- GET /api/v1/fleet/headroom: memory headroom of each job active in the window (operators);

Everything here reads the hourly rollups or the stored reports: nothing is recomputed.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
from fastapi import APIRouter, Query, Response
from sqlalchemy import Float, Integer, String, func, literal, null, select, union_all
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from server.analysis.fleet.rollup import ENERGY_SOURCES
from server.db import epoch_column, is_postgres
from server.deps import OperatorAuth, SessionDep
from server.fleet import service as fleet_service
from server.fleet.router import parse_window
from server.fleet.schemas import FleetHeadroom, FleetTimeline
from server.models import Gpu, GpuHourly, Node
from server.models.base import from_epoch
from server.responses import json_response

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])

MAX_HEATMAP_ROWS = 5000


@router.get("/timeline", response_model=FleetTimeline,
            summary="Per-GPU utilization by hour (heatmap) and fleet energy by hour")
def fleet_timeline(_: OperatorAuth, session: SessionDep,
                   window: str = Query("24h", description="e.g. 6h, 24h, 7d")) -> Response:
    now = time.time()
    start = now - parse_window(window)
    start -= start % 3600  # the hour the window starts in is drawn whole
    gpu_rows, hour_rows = _timeline_rows(session, from_epoch(start), MAX_HEATMAP_ROWS)
    hours = np.unique(np.array([r.hour for r in hour_rows], dtype=np.float64))
    col = np.searchsorted(hours, np.array([r.hour for r in hour_rows], dtype=np.float64))
    n_energy = np.array([r.n_energy for r in hour_rows], dtype=np.int64)
    energy_j = np.array([r.energy_j for r in hour_rows], dtype=np.float64)  # NULL (no energy) -> nan
    energy_gpus = np.bincount(col, weights=n_energy, minlength=len(hours)).astype(np.int64)
    has = n_energy > 0
    energy = np.bincount(col[has], weights=energy_j[has], minlength=len(hours))
    # Joules per hour by where they came from; "unrecorded": a rollup written before its source was recorded.
    by_source: dict[str, np.ndarray] = {}
    for i in np.flatnonzero(has):
        by_source.setdefault(hour_rows[i].source, np.full(len(hours), np.nan))[col[i]] = energy_j[i]
    truncated = len(gpu_rows) > MAX_HEATMAP_ROWS
    gpus = gpu_rows[:MAX_HEATMAP_ROWS]
    # Heatmap row of each GPU id (-1: not drawn), then one numpy assignment per hour and source, not per cell.
    row_of = np.full(max((g.gpu_id for g in gpus), default=0) + 1, -1)
    row_of[[g.gpu_id for g in gpus]] = np.arange(len(gpus))
    util = np.full((len(gpus), len(hours)), np.nan)
    for r, c in zip(hour_rows, col, strict=True):
        if r.gpu_ids:
            util[row_of[np.array(r.gpu_ids)], c] = np.array(r.util_pct, dtype=np.float64)
    by_source_j = {k: _nullable(v) for k, v in by_source.items()}
    return json_response({
        "window_s": parse_window(window), "generated_at": now, "hours": hours.tolist(),
        "gpus": [{"node": g.node, "index": g.gpu_index, "uuid": g.uuid} for g in gpus],
        "gpu_util_mean_pct": _nullable(util), "truncated": truncated,
        "energy_j": _nullable(np.where(energy_gpus > 0, energy, np.nan)), "energy_gpus": energy_gpus.tolist(),
        "energy_by_source_j": {k: by_source_j[k] for k in ENERGY_SOURCES if k in by_source_j},
        "energy_source": [_hour_source([v[c] for v in by_source_j.values()], list(by_source_j))
                          for c in range(len(hours))],
        "sources": {"gpu_util_mean_pct": "gpu_hourly rollups: hourly mean of NVML gpu_util_pct",
                    "energy_j": "gpu_hourly rollups: NVML total-energy counter deltas where the GPU has the counter, "
                                "else integrated power; energy_source (per hour) and energy_by_source_j say which"},
    })


class _GpuRow(NamedTuple):
    node: str
    gpu_index: int  # not `index`: that is tuple.index
    uuid: str
    gpu_id: int


class _HourRow(NamedTuple):
    hour: float  # epoch s
    energy_j: float | None
    n_energy: int  # GPUs with energy in the hour, from this source
    gpu_ids: list[int] | None  # the heatmap's GPUs with a rollup in the hour ...
    util_pct: list[float | None] | None  # ... and their util_mean_pct
    source: str


def _timeline_rows(session: Session, since: datetime, max_gpus: int) -> tuple[list[_GpuRow], list[_HourRow]]:
    """The window's rollups aggregated in SQL, in one statement (both its reads of `gpu_hourly` go through
    `ix_gpu_hourly_hour`; the 7 d window at 10,000 GPUs is 1.68 M rollups, docs/ARCHITECTURE.md):

    - GPU rows: the first `max_gpus` + 1 GPUs with rollups in the window by node name and GPU index (the extra one
      only says that the heatmap is truncated);
    - hour rows, one per hour and energy source (NULL -> "unrecorded"): joules summed over its GPUs (NULL where
      none had energy), how many had energy, and the heatmap GPUs' ids with their util_mean_pct, as two arrays in
      matching order. Grouping follows the index's hour order: only each hour's rows are sorted (by source),
    in memory, where the whole window's sort used to spill to disk."""
    in_window = GpuHourly.hour >= since
    if not is_postgres(session):
        return _timeline_rows_embedded(session, since, max_gpus)
    present = select(GpuHourly.gpu_id).where(in_window).distinct().subquery()
    order = (Node.name, Gpu.index, Gpu.id)
    chosen = (select(Gpu.id, Node.name, Gpu.index, Gpu.uuid, func.row_number().over(order_by=order).label("rank"))
              .select_from(present).join(Gpu, Gpu.id == present.c.gpu_id).join(Node, Node.id == Gpu.node_id)
              .order_by(*order).limit(max_gpus + 1).cte("chosen"))
    in_heatmap = GpuHourly.gpu_id.in_(select(chosen.c.id).where(chosen.c.rank <= max_gpus))
    source = func.coalesce(func.nullif(GpuHourly.energy_source, ""), "unrecorded")
    no_int, no_float = null().cast(Integer), null().cast(Float)
    gpu_rows = select(literal("gpu").label("kind"), chosen.c.name, chosen.c.index, chosen.c.uuid, chosen.c.id,
                      chosen.c.rank, no_float, no_float, no_int, null().cast(ARRAY(Integer)),
                      null().cast(ARRAY(Float)))
    hour_rows = (select(literal("hour"), source, no_int, null().cast(String), no_int, no_int,
                        func.date_part("epoch", GpuHourly.hour),  # float8, unlike EXTRACT's numeric
                        func.sum(GpuHourly.energy_j), func.count(GpuHourly.energy_j),
                        func.array_agg(GpuHourly.gpu_id).filter(in_heatmap),
                        func.array_agg(GpuHourly.util_mean_pct).filter(in_heatmap))
                 .where(in_window).group_by(GpuHourly.hour, source))
    rows = session.execute(union_all(gpu_rows, hour_rows)).all()
    gpus = sorted((r for r in rows if r.kind == "gpu"), key=lambda r: r.rank)
    hours = [r for r in rows if r.kind == "hour"]
    return ([_GpuRow(node=r.name, gpu_index=r._mapping["index"], uuid=r.uuid, gpu_id=r.id) for r in gpus],
            [_HourRow(hour=r[6], energy_j=r[7], n_energy=r[8], gpu_ids=r[9], util_pct=r[10], source=r.name)
             for r in hours])


def _chosen_gpus(session: Session, since: datetime, max_gpus: int) -> list[_GpuRow]:
    present = select(GpuHourly.gpu_id).where(GpuHourly.hour >= since).distinct().subquery()
    order = (Node.name, Gpu.index, Gpu.id)
    rows = session.execute(select(Node.name, Gpu.index, Gpu.uuid, Gpu.id).select_from(present)
                           .join(Gpu, Gpu.id == present.c.gpu_id).join(Node, Node.id == Gpu.node_id)
                           .order_by(*order).limit(max_gpus + 1)).all()
    return [_GpuRow(node=r[0], gpu_index=r[1], uuid=r[2], gpu_id=r[3]) for r in rows]


def _timeline_rows_embedded(session: Session, since: datetime,
                            max_gpus: int) -> tuple[list[_GpuRow], list[_HourRow]]:
    """_timeline_rows for SQLite (embedded mode: a small fleet; no arrays, no FILTER): the same rows, grouped
    in Python."""
    gpus = _chosen_gpus(session, since, max_gpus)
    drawn = {g.gpu_id for g in gpus[:max_gpus]}
    groups: dict[tuple[float, str], list[Any]] = {}
    rows = session.execute(select(epoch_column(session, GpuHourly.hour), GpuHourly.energy_source, GpuHourly.gpu_id,
                                  GpuHourly.util_mean_pct, GpuHourly.energy_j)
                           .where(GpuHourly.hour >= since).order_by(GpuHourly.hour)).all()
    for hour, source, gpu_id, util_pct, energy_j in rows:
        # SQLite reads timestamps back through julianday: ~10 us of float error on an hour mark
        g = groups.setdefault((round(float(hour), 3), source or "unrecorded"), [None, 0, [], []])
        if energy_j is not None:
            g[0] = (g[0] or 0.0) + energy_j
            g[1] += 1
        if gpu_id in drawn:
            g[2].append(gpu_id)
            g[3].append(util_pct)
    return gpus, [_HourRow(hour, e, n, ids or None, utils or None, source)
                  for (hour, source), (e, n, ids, utils) in groups.items()]


def _nullable(values: np.ndarray) -> list[Any]:
    """nan (no rollup, or a rollup without the value) -> None: unknown is null in the JSON, never 0."""
    out = values.astype(object)
    out[np.isnan(values)] = None
    return out.tolist()


def _hour_source(values: list[float | None], names: list[str]) -> str | None:
    """The one source of an hour's energy, "mixed" when several contributed, None when the hour has none."""
    present = {n for n, v in zip(names, values, strict=True) if v is not None}
    if not present:
        return None
    return present.pop() if len(present) == 1 else "mixed"


@router.get("/headroom", response_model=FleetHeadroom,
            summary="Memory headroom of each job active in the window (from job reports)")
def fleet_headroom(_: OperatorAuth, session: SessionDep,
                   window: str = Query("24h", description="e.g. 6h, 24h, 7d"),
                   limit: int = Query(5000, ge=1, le=50_000)) -> dict[str, Any]:
    since = from_epoch(time.time() - parse_window(window))
    jobs = [{"job_id": r["job_id"], "team": r["team"], "peak_used_bytes": r["peak_used_bytes"],
             "memory_total_bytes": r["memory_total_bytes"], "headroom_bytes": r["headroom_bytes"],
             "gpu_count": r["gpus"]} for r in fleet_service.job_rows(session, since, limit=limit)]
    return {"window_s": parse_window(window), "jobs": jobs,
            "source": "job reports: largest single-GPU NVML peak vs that GPU's capacity"}
