"""Loading a job's data from the database into the pure analyzers' `JobData`, and caching the report.

The analysis itself lives in `server.analysis` (pure, no database). This module only reads and writes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from agent.protocol import SAMPLE_FIELD_NAMES
from server.analysis import characterize as characterize_mod
from server.analysis.fit_advice import fit_recommendations
from server.analysis.fleet import job_fleet_row
from server.analysis.jobdata import EnergySettings, GpuSeries, JobData, ProcessPeak, StepSeries
from server.analysis.jobdata import LayerStat as LayerRow
from server.analysis.trace_sections import merge_trace_sections
from server.auth import policy
from server.auth.policy import link_window
from server.config import ServerSettings
from server.db import dialect_insert, epoch_column, float_rows, read_in_parallel, session_scope
from server.jobs import plot_views
from server.jobs.plot_series import step_memory_source
from server.lru import LruCache
from server.models import (
    TERMINAL_STATES,
    Gpu,
    GpuSample,
    Job,
    JobEvent,
    JobGpu,
    JobStep,
    LayerStat,
    ProcessSample,
    Report,
    Trace,
)
from server.models.base import epoch_us, from_epoch, to_epoch, utcnow

log = logging.getLogger(__name__)

# Samples may reach the server after the job ended (an agent's spool draining after an outage): a report
# computed within this window after the end is not final, and is recomputed when asked for.
LATE_DATA_WINDOW = timedelta(minutes=5)


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
    return GpuSeries(uuid=gpu.uuid, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes, ts=data[:, 0],
                     columns={c: data[:, i + 1] for i, c in enumerate(columns)}, power_source=gpu.power_source)


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


# ------------------------------------------------------------------------------------------------ running jobs
# A running job is characterized again every minute (characterize_running_every_s), and reading its whole history
# each time is what that costs (24 h x 8 GPUs: ~1.4 s of 1.5 s). Each worker process keeps what it last read of a
# running job (per GPU series, and the steps), and the next run reads only the rows from SERIES_OVERLAP_S before
# the end of that read: stragglers up to that late are picked up; later ones only by the final characterization,
# which always reads everything.
SERIES_OVERLAP_S = 600.0


@dataclass(frozen=True)
class _Read:
    value: Any  # GpuSeries | StepSeries
    until: float  # epoch s: the end of the window that was read
    nbytes: int


RUNNING_SERIES: LruCache[tuple[Any, ...], _Read] = LruCache(max_entries=4096, max_weight=256 * 2**20,
                                                           weigh=lambda r: r.nbytes)


def _running_key(session: Session, job: Job, *what: Any) -> tuple[Any, ...]:
    """What identifies one job's reads: database, job row (ids are reused after a restore; creation times not)."""
    return (str(session.get_bind().engine.url), job.id, job.created_at, *what)


def _since_last_read(key: tuple[Any, ...], until: float, read: Callable[[datetime | None], Any],
                     join: Callable[[Any, int, Any], Any], *, floor_s: float = 0.0) -> Any:
    """`read(None)` reads everything up to `until`, `read(cut)` the rows at or after `cut`; with this process's
    earlier read of `key`, only the latter, joined to the earlier rows before the cut (`join(old, cut_us, new)`).
    The cut is in whole microseconds, as the database stores times, so no row is counted twice."""
    hit = RUNNING_SERIES.get(key)
    if hit is None or hit.value is None or hit.until > until:
        value = read(None)
    else:
        cut_us = epoch_us(max(hit.until - SERIES_OVERLAP_S, floor_s))
        value = join(hit.value, cut_us, read(from_epoch(cut_us / 1e6)))
    RUNNING_SERIES.put(key, _Read(value, until, _weight(value)))
    return value


def _weight(value: Any) -> int:
    """Bytes a cached read holds: its arrays (series), or a row estimate (aggregates)."""
    if value is None:
        return 0
    if isinstance(value, list):
        return 256 * len(value)
    arrays = [v for v in vars(value).values() if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in (*arrays, *getattr(value, "columns", {}).values()))


def _before(ts: np.ndarray, cut_us: int) -> np.ndarray:
    """The rows of an earlier read that the new read (from `cut_us` on) does not read again."""
    return np.rint(ts * 1e6) < cut_us


def _gpu_series_running(session: Session, job: Job, gpu: Gpu, start: datetime, end: datetime) -> GpuSeries:
    def join(old: GpuSeries, cut_us: int, new: GpuSeries) -> GpuSeries:
        keep = _before(old.ts, cut_us)
        return dataclasses.replace(new, ts=np.concatenate([old.ts[keep], new.ts]), columns={
            c: np.concatenate([old.columns[c][keep], new.columns[c]]) for c in new.columns})

    return _since_last_read(_running_key(session, job, "gpu", gpu.id, to_epoch(start)), to_epoch(end) or 0.0,
                            lambda cut: load_gpu_series(session, gpu, cut or start, end), join,
                            floor_s=to_epoch(start) or 0.0)


def _steps_running(session: Session, job: Job, now: float) -> StepSeries | None:
    def join(old: StepSeries, cut_us: int, new: StepSeries | None) -> StepSeries:
        keep = _before(old.ts, cut_us)
        arrays = {c: np.concatenate([getattr(old, c)[keep]] + ([getattr(new, c)] if new is not None else []))
                  for c in _STEP_ARRAYS}
        order = np.lexsort((arrays["step"], arrays["rank"]))
        return StepSeries(**{c: v[order] for c, v in arrays.items()},
                          memory_source=new.memory_source if new is not None else old.memory_source)

    return _since_last_read(_running_key(session, job, "steps"), now,
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

    return _since_last_read(_running_key(session, job, "processes", gpu.id, to_epoch(start)), to_epoch(end) or 0.0,
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
    gpus = [r.result() for r in reads]
    oom = session.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.job_pk == job.id,
                                                                          JobEvent.kind == "oom")) or 0
    return JobData(
        job_id=job.job_id, state=job.state, name=job.name, team=job.team, started_at=to_epoch(job.started_at),
        ended_at=to_epoch(job.ended_at), exit_code=job.exit_code, batch_size=job.batch_size,
        gpu_type_requested=job.gpu_type_requested, gpus_requested=job.gpus_requested, gpus=gpus,
        steps=_steps_running(session, job, now) if incremental else _load_steps(session, job),
        layers=_load_layers(session, job), layer_step_s=_layer_step_s(session, job), oom_events=int(oom),
        processes=[p for r in process_reads for p in r.result()],
        # Uploaded traces are merged after characterization (server.analysis.trace_sections).
        trace_summaries=[],
        energy_settings=EnergySettings(grid_intensity_g_per_kwh=settings.grid_intensity_g_per_kwh, pue=settings.pue,
                                       price_per_kwh_usd=settings.price_per_kwh_usd),
    )


def compute_report(session: Session, job: Job, settings: ServerSettings) -> dict:
    """Characterize now and store the result (idempotent: same data, same report)."""
    now = time.time()
    running = job.state not in TERMINAL_STATES
    report = characterize_mod.characterize(load_job_data(session, job, settings, now=now, incremental=running),
                                           now=now)
    traces = [t.summary | {"kind": t.kind, "filename": t.filename, "rank": t.rank}
              for t in session.scalars(select(Trace).where(Trace.job_pk == job.id).order_by(Trace.id))]
    merge_trace_sections(report, traces)
    # near or past capacity: needs the layer table and the trace's breakdown, so after the merge
    report["recommendations"] = [*(report.get("recommendations") or []), *fit_recommendations(report)]
    report.setdefault("team", job.team)
    report.setdefault("name", job.name)
    # An upsert: the worker (or the in-process task) and a reader may characterize the same job at once.
    ins = dialect_insert(session)
    stmt = ins(Report).values(job_pk=job.id, analyzer_version=characterize_mod.ANALYZER_VERSION,
                              computed_at=from_epoch(now), data=report, fleet_row=job_fleet_row(report))
    session.execute(stmt.on_conflict_do_update(index_elements=["job_pk", "analyzer_version"],
                                               set_={"computed_at": stmt.excluded.computed_at,
                                                     "data": stmt.excluded.data,
                                                     "fleet_row": stmt.excluded.fleet_row}))
    now_dt = from_epoch(now)
    assert now_dt is not None
    if is_final_at(now_dt, job):
        # The final report: the page's plots, which will not change either, are stored beside it.
        plot_views.store(session, job, job_gpu_windows(session, job, now=now_dt), computed_at=now_dt)
    session.expire_all()
    return report


def cached_report(session: Session, job: Job) -> Report | None:
    return session.get(Report, (job.id, characterize_mod.ANALYZER_VERSION))


def is_final(report: Report, job: Job) -> bool:
    return is_final_at(report.computed_at, job)


def is_final_at(computed_at: datetime, job: Job) -> bool:
    """Whether what was computed at `computed_at` from an ended job's data is final: after the late-data window
    and after the job's last update."""
    if job.state not in TERMINAL_STATES or job.ended_at is None:
        return False
    return computed_at >= job.ended_at + LATE_DATA_WINDOW and computed_at >= job.updated_at


def final_plot_views(session: Session, job: Job) -> plot_views.PlotViews | None:
    """The job's stored plot views when they are final (stored after its end and its last update), else None."""
    views = plot_views.load(session, job)
    return views if views is not None and is_final_at(views.computed_at, job) else None


def get_report(session: Session, job: Job, settings: ServerSettings, *, refresh: bool = False) -> dict:
    row = cached_report(session, job)
    if row is not None and not refresh and is_final(row, job):
        return row.data
    return compute_report(session, job, settings)


def characterize_job_pk(factory: sessionmaker[Session], job_pk: int, settings: ServerSettings) -> bool:
    """The task body (Celery or in-process): False when the job no longer exists."""
    with session_scope(factory) as session:
        job = session.get(Job, job_pk)
        if job is None:
            return False
        compute_report(session, job, settings)
        return True


def jobs_due(session: Session, *, every_s: float) -> list[int]:
    """Jobs whose report needs (re)computing: running jobs with no report or one older than `every_s`; ended
    jobs with no final report, once their late-data window has closed, or at once when the job changed after
    its report (an end registered late, whose own characterization was lost with a broker outage).

    Candidates are selected in SQL (the sweep must not scan every job): the sweep runs every minute, so an
    ended job is only considered during the day after its end unless it has no report or a stale one."""
    now = utcnow()
    report = select(Report.job_pk, Report.computed_at).where(
        Report.analyzer_version == characterize_mod.ANALYZER_VERSION).subquery()
    running = Job.state.in_(("running", "pending"))
    stmt = (select(Job.id, Job.state, Job.ended_at, Job.updated_at, report.c.computed_at)
            .outerjoin(report, report.c.job_pk == Job.id)
            .where(report.c.computed_at.is_(None)
                   | (running & (report.c.computed_at < now - timedelta(seconds=every_s)))
                   | (~running & ((report.c.computed_at < Job.updated_at)
                                  | (Job.ended_at >= now - timedelta(days=1)))))
            .order_by(Job.id))
    due = []
    for pk, state, ended_at, updated_at, computed_at in session.execute(stmt):
        if computed_at is None or state in ("running", "pending") or ended_at is None:
            due.append(pk)
            continue
        window_closed = ended_at + LATE_DATA_WINDOW
        if updated_at > computed_at or computed_at < window_closed <= now:
            due.append(pk)
    return due


# Cached reports' `rightsizing_inputs`, keyed by what identifies one stored report: (database, job_pk, analyzer
# version, computed_at). The inputs sit inside the report document (~70 KiB for 2 h x 8 GPUs), and Postgres
# decompresses a whole TOASTed JSONB value to read one key: 50 runs of history cost ~7 ms per request that way,
# ~0.1 ms from here. Entries are small (a few hundred bytes plus one peak per hour of the run).
RIGHTSIZING_INPUTS: LruCache[tuple[Any, ...], Mapping[str, Any]] = LruCache(max_entries=50_000)


def has_report(session: Session, job: Job) -> bool:
    """Whether the job has a cached report of this analyzer version (without reading the document)."""
    return session.scalar(select(Report.computed_at).where(
        Report.job_pk == job.id, Report.analyzer_version == characterize_mod.ANALYZER_VERSION)) is not None


def rightsizing_history(session: Session, job: Job, *, limit: int,
                        cache: LruCache[tuple[Any, ...], Mapping[str, Any]] = RIGHTSIZING_INPUTS,
                        ) -> list[tuple[str, Mapping[str, Any]]]:
    """(job_id, rightsizing inputs) of this job and earlier runs of the same name and team, oldest first.

    Only the small `rightsizing_inputs` part of each cached report is read, never the samples, and only for the
    reports `cache` does not hold yet: a repeated question costs one query on jobs and report timestamps.
    The inputs are shared between requests: read them, never change them.
    """
    version = characterize_mod.ANALYZER_VERSION
    stmt = (select(Job.job_id, Report.job_pk, Report.computed_at)
            .join(Report, (Report.job_pk == Job.id) & (Report.analyzer_version == version))
            .order_by(Job.started_at.desc().nulls_last(), Job.id.desc()).limit(limit))
    if job.name:
        stmt = stmt.where(Job.name == job.name, (Job.team == job.team) if job.team else Job.team.is_(None))
    else:
        stmt = stmt.where(Job.id == job.id)
    rows = session.execute(stmt).all()
    database = str(session.get_bind().engine.url)
    keys = [(database, pk, version, computed_at) for _, pk, computed_at in rows]
    found = cache.get_many(keys)
    missing = [k[1] for k in keys if k not in found]
    if missing:
        fetched = session.execute(select(Report.job_pk, Report.computed_at, Report.data["rightsizing_inputs"])
                                  .where(Report.analyzer_version == version, Report.job_pk.in_(missing)))
        for pk, computed_at, data in fetched:
            if isinstance(data, dict):
                key = (database, pk, version, computed_at)
                found[key] = MappingProxyType(data)
                cache.put(key, found[key])
    # A report recomputed between the two reads has a new key and sits this answer out.
    return [(job_id, found[k]) for (job_id, _, _), k in zip(rows, keys, strict=True) if k in found][::-1]
