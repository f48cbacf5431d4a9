"""Loading a job's data from the database into the pure analyzers' `JobData`: the GPUs' windows and sample series,
the processes, steps and layers; a running job's reads go through this process's cache (running_cache).

The analysis itself lives in `server.analysis` (pure, no database). This module only reads.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetprof.protocol import SAMPLE_FIELD_NAMES
from server.analysis.base.jobdata import EnergySettings, GpuSeries, JobData, ProcessPeak, StepSeries
from server.analysis.base.jobdata import LayerStat as LayerRow
from server.auth import policy
from server.auth.policy import link_window
from server.config import ServerSettings
from server.db import epoch_column, float_rows, read_in_parallel
from server.jobs.framework_info import framework_of
from server.jobs.plot_series import step_memory_source
from server.jobs.running_cache import rows_before, running_key, since_last_read
from server.models import Gpu, GpuSample, Job, JobEvent, JobGpu, JobStep, LayerStat, Node, ProcessSample
from server.models.base import from_epoch, to_epoch


def job_gpu_windows(session: Session, job: Job, *, now: datetime) -> list[tuple[Gpu, datetime, datetime]]:
    """Each GPU of the job with the time window its telemetry belongs to the job: never another team's time on
    that GPU (server.auth.policy.clip_window), which every read of the job's samples goes through."""
    out = []
    links = session.execute(
        select(JobGpu, Gpu).join(Gpu, Gpu.id == JobGpu.gpu_id).where(JobGpu.job_pk == job.id).order_by(Gpu.index)
    ).tuples().all()
    foreign = policy.foreign_spans(session, job, [gpu.id for _, gpu in links], now=now) if links else {}
    for link, gpu in links:
        window = link_window(job, link, now=now)
        if window is not None:
            window = policy.clip_window(window, link, foreign.get(gpu.id, []))
        if window is not None:
            out.append((gpu, *window))
    return out


def load_gpu_series(session: Session, gpu: Gpu, start: datetime, end: datetime,
                    columns: tuple[str, ...] = SAMPLE_FIELD_NAMES) -> GpuSeries:
    table = GpuSample.__table__
    stmt = (select(epoch_column(session, table.c.ts), *(table.c[c] for c in columns))
            .where(table.c.gpu_id == gpu.id, table.c.ts >= start, table.c.ts <= end).order_by(table.c.ts))
    data = float_rows(session, stmt, len(columns) + 1)
    # max_sm_clock_mhz / slowdown_temperature_c: GPU facts of issue #20, read when the gpus table has them
    return GpuSeries(uuid=gpu.uuid, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes, ts=data[:, 0],
                     columns={c: data[:, i + 1] for i, c in enumerate(columns)}, power_source=gpu.power_source,
                     max_sm_clock_mhz=gpu.max_sm_clock_mhz, slowdown_temperature_c=gpu.slowdown_temperature_c)


def load_process_peaks(session: Session, gpu: Gpu, start: datetime, end: datetime) -> list[ProcessPeak]:
    """Every process seen on `gpu` in [start, end]: its peak used memory and when it was first and last seen,
    aggregated in SQL (a process row per GPU per second at 1 Hz: 86,400 a day per GPU and process)."""
    t = ProcessSample.__table__
    ts = epoch_column(session, t.c.ts)
    rows = session.execute(
        select(t.c.pid, t.c.job_id, func.max(t.c.attribution), func.max(t.c.used_memory_bytes), func.min(ts),
               func.max(ts))
        .where(t.c.gpu_id == gpu.id, t.c.ts >= start, t.c.ts <= end).group_by(t.c.pid, t.c.job_id)).all()
    return [ProcessPeak(gpu_uuid=gpu.uuid, pid=pid, job_id=job_id, attribution=how,
                        peak_used_bytes=None if peak is None else int(peak), first_ts=float(lo), last_ts=float(hi))
            for pid, job_id, how, peak, lo, hi in rows]


_STEP_ARRAYS = ("rank", "step", "ts", "wall_s", "device_s", "samples", "allocated_peak_bytes", "reserved_peak_bytes")


def _load_steps(session: Session, job: Job, since: datetime | None = None) -> StepSeries | None:
    """The job's steps (those at or after `since`), ordered by (rank, step)."""
    t = JobStep.__table__
    where = [t.c.job_pk == job.id] + ([t.c.ts >= since] if since is not None else [])
    a = float_rows(session, select(*(epoch_column(session, t.c.ts) if c == "ts" else t.c[c] for c in _STEP_ARRAYS))
                   .where(*where).order_by(t.c.rank, t.c.step), len(_STEP_ARRAYS))
    if not a.size:
        return None
    source = step_memory_source(session, [JobStep.job_pk == job.id])
    cols = {c: a[:, i] for i, c in enumerate(_STEP_ARRAYS)}
    return StepSeries(**{**cols, "rank": cols["rank"].astype(np.int64), "step": cols["step"].astype(np.int64)},
                      memory_source=source)


def _gpu_series_running(session: Session, job: Job, gpu: Gpu, start: datetime, end: datetime) -> GpuSeries:
    def join(old: GpuSeries, cut_us: int, new: GpuSeries) -> GpuSeries:
        keep = rows_before(old.ts, cut_us)
        return dataclasses.replace(new, ts=np.concatenate([old.ts[keep], new.ts]), columns={
            c: np.concatenate([old.columns[c][keep], new.columns[c]]) for c in new.columns})

    return since_last_read(running_key(session, job, "gpu", gpu.id, to_epoch(start)), to_epoch(end) or 0.0,
                           lambda cut: load_gpu_series(session, gpu, cut or start, end), join,
                           floor_s=to_epoch(start) or 0.0)


def _steps_running(session: Session, job: Job, now: float) -> StepSeries | None:
    def join(old: StepSeries, cut_us: int, new: StepSeries | None) -> StepSeries:
        keep = rows_before(old.ts, cut_us)
        arrays = {c: np.concatenate([getattr(old, c)[keep]] + ([getattr(new, c)] if new is not None else []))
                  for c in _STEP_ARRAYS}
        order = np.lexsort((arrays["step"], arrays["rank"]))
        return StepSeries(**{c: v[order] for c, v in arrays.items()},
                          memory_source=new.memory_source if new is not None else old.memory_source)

    return since_last_read(running_key(session, job, "steps"), now,
                           lambda cut: _load_steps(session, job, since=cut), join)


def _processes_running(session: Session, job: Job, gpu: Gpu, start: datetime, end: datetime) -> list[ProcessPeak]:
    def join(old: list[ProcessPeak], _cut_us: int, new: list[ProcessPeak]) -> list[ProcessPeak]:
        # Maxima and minima: rows read twice (the overlap) change nothing, so no cut is needed.
        merged = {(p.pid, p.job_id): p for p in old}
        for p in new:
            o = merged.get((p.pid, p.job_id))
            merged[(p.pid, p.job_id)] = p if o is None else dataclasses.replace(
                p, attribution=max(o.attribution or "", p.attribution or "") or None,
                peak_used_bytes=max((v for v in (o.peak_used_bytes, p.peak_used_bytes) if v is not None),
                                    default=None),
                first_ts=min(o.first_ts, p.first_ts), last_ts=max(o.last_ts, p.last_ts))
        return list(merged.values())

    return since_last_read(running_key(session, job, "processes", gpu.id, to_epoch(start)), to_epoch(end) or 0.0,
                           lambda cut: load_process_peaks(session, gpu, cut or start, end), join,
                           floor_s=to_epoch(start) or 0.0)


def _load_layers(session: Session, job: Job) -> list[LayerRow]:
    rows = session.execute(
        select(LayerStat.module, func.max(LayerStat.module_type), func.avg(LayerStat.forward_s),
               func.avg(LayerStat.backward_s), func.max(LayerStat.activation_bytes), func.sum(LayerStat.calls))
        .where(LayerStat.job_pk == job.id).group_by(LayerStat.module)
    ).all()
    return [LayerRow(module=m, module_type=t, forward_s=f, backward_s=b,
                     activation_bytes=None if a is None else int(a), calls=int(c or 0)) for m, t, f, b, a, c in rows]


def _layer_step_s(session: Session, job: Job) -> float | None:
    """Mean wall time of the steps (rank, step) the layer stats were sampled in: what the layers' shares are of."""
    sampled = (select(LayerStat.id).where(LayerStat.job_pk == JobStep.job_pk, LayerStat.rank == JobStep.rank,
                                          LayerStat.step == JobStep.step).exists())
    value = session.scalar(select(func.avg(JobStep.wall_s)).where(JobStep.job_pk == job.id, sampled))
    return None if value is None else float(value)


def _estimate_of(job: Job) -> dict[str, Any] | None:
    """The estimate stored with the job (`metadata.estimate`), when it is one."""
    est = (job.extra or {}).get("estimate")
    return est if isinstance(est, dict) else None


def load_job_data(session: Session, job: Job, settings: ServerSettings, *, now: float,
                  incremental: bool = False) -> JobData:
    """The job's arrays; `incremental` (a running job): what this process read last time, plus what came since."""
    now_dt = from_epoch(now)
    assert now_dt is not None
    # The GPUs' reads overlap on connections of their own (8 GPUs x 24 h at 1 Hz, 2 cores: 1.4 s -> 0.75 s).
    windows = job_gpu_windows(session, job, now=now_dt)
    reads = [read_in_parallel(session, _gpu_series_running, job, gpu, start, end) if incremental else
             read_in_parallel(session, load_gpu_series, gpu, start, end)
             for gpu, start, end in windows]
    process_reads = [read_in_parallel(session, _processes_running, job, gpu, start, end) if incremental else
                     read_in_parallel(session, load_process_peaks, gpu, start, end) for gpu, start, end in windows]
    # the GPUs' nodes' batch source ("test": the NVML test double), so that figures say where they came from
    node_ids = list({gpu.node_id for gpu, _, _ in windows})
    node_source: dict[int, str | None] = dict(session.execute(
        select(Node.id, Node.last_source).where(Node.id.in_(node_ids))).tuples().all()) if node_ids else {}
    gpus = [dataclasses.replace(r.result(), sample_source=node_source.get(gpu.node_id))
            for r, (gpu, _, _) in zip(reads, windows, strict=True)]
    oom = session.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.job_pk == job.id,
                                                                          JobEvent.kind == "oom")) or 0
    return JobData(
        job_id=job.job_id, state=job.state, name=job.name, team=job.team, started_at=to_epoch(job.started_at),
        ended_at=to_epoch(job.ended_at), exit_code=job.exit_code, batch_size=job.batch_size,
        gpu_type_requested=job.gpu_type_requested, gpus_requested=job.gpus_requested, gpus=gpus,
        steps=_steps_running(session, job, now) if incremental else _load_steps(session, job),
        layers=_load_layers(session, job), layer_step_s=_layer_step_s(session, job), oom_events=int(oom),
        processes=[p for r in process_reads for p in r.result()],
        framework=framework_of(job),
        estimate=_estimate_of(job),
        # Uploaded traces are merged after characterization (server.analysis.traces.sections).
        trace_summaries=[],
        energy_settings=EnergySettings(grid_intensity_g_per_kwh=settings.grid_intensity_g_per_kwh, pue=settings.pue,
                                       price_per_kwh_usd=settings.price_per_kwh_usd),
    )
