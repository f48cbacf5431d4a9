"""Loading a job's data from the database into the pure analyzers' `JobData`, and caching the report.

The analysis itself lives in `server.analysis` (pure, no database). This module only reads and writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import numpy as np
from sqlalchemy import Float, cast, extract, func, literal_column, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from agent.protocol import SAMPLE_FIELDS
from server.analysis import characterize as characterize_mod
from server.analysis.fleet import job_fleet_row
from server.analysis.trace_sections import merge_trace_sections
from server.analysis.jobdata import EnergySettings, GpuSeries, JobData, LayerStat as LayerRow, StepSeries
from server.config import ServerSettings
from server.db import is_postgres, session_scope
from server.models import TERMINAL_STATES, Gpu, GpuSample, Job, JobEvent, JobGpu, JobStep, LayerStat, Report, Trace
from server.models.base import from_epoch, to_epoch, utcnow

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = tuple(name for name, _ in SAMPLE_FIELDS)
# Samples may reach the server after the job ended (an agent's spool draining after an outage): a report
# computed within this window after the end is not final, and is recomputed when asked for.
LATE_DATA_WINDOW = timedelta(minutes=5)


def epoch_column(session: Session, column):  # type: ignore[no-untyped-def]
    """A timestamp column as float seconds since epoch, per dialect."""
    if is_postgres(session):
        return literal_column(f"extract(epoch from {column.name})::float8")
    return (func.julianday(column) - 2440587.5) * 86400.0


def link_window(job: Job, link: JobGpu, *, now: datetime) -> tuple[datetime, datetime] | None:
    """The time a GPU's telemetry belongs to a job (both ends included): from the job's start, else when the
    agent first saw it on the GPU, to its end, else when last seen once it ended, else now. None when unknown.
    The one rule for reports and for the per-job/per-team rollups."""
    start = job.started_at or link.first_seen_at
    end = job.ended_at or (link.last_seen_at if job.state in TERMINAL_STATES else now)
    if start is None or end is None:
        return None
    return start, end


def job_gpu_windows(session: Session, job: Job, *, now: datetime) -> list[tuple[Gpu, datetime, datetime]]:
    """Each GPU of the job with the time window its telemetry belongs to the job."""
    out = []
    links = session.execute(
        select(JobGpu, Gpu).join(Gpu, Gpu.id == JobGpu.gpu_id).where(JobGpu.job_pk == job.id).order_by(Gpu.index)
    ).all()
    for link, gpu in links:
        window = link_window(job, link, now=now)
        if window is not None:
            out.append((gpu, *window))
    return out


def float_rows(session: Session, stmt, ncols: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The result of `stmt` (numeric or null columns) as a float64 array, null as NaN. Postgres: through
    COPY ... TO STDOUT and pandas' C parser (a 24 h x 1 Hz GPU series is 86,400 rows: building Python tuples for
    them cost ~10x more); SQLite: through rows."""
    if not is_postgres(session):
        rows = session.execute(stmt).all()
        return np.array(rows, dtype=np.float64) if rows else np.empty((0, ncols))
    import io

    import pandas as pd

    sql = str(stmt.compile(dialect=session.get_bind().dialect, compile_kwargs={"literal_binds": True}))
    buf = io.BytesIO()
    with session.connection().connection.dbapi_connection.cursor() as cur:
        cur.copy_expert(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv)", buf)
    if buf.tell() == 0:
        return np.empty((0, ncols))
    buf.seek(0)
    return pd.read_csv(buf, header=None, dtype=np.float64, na_values=[""], keep_default_na=False).to_numpy()


def load_gpu_series(session: Session, gpu: Gpu, start: datetime, end: datetime,
                    columns: tuple[str, ...] = SAMPLE_COLUMNS) -> GpuSeries:
    table = GpuSample.__table__
    stmt = (select(epoch_column(session, table.c.ts), *(table.c[c] for c in columns))
            .where(table.c.gpu_id == gpu.id, table.c.ts >= start, table.c.ts <= end).order_by(table.c.ts))
    data = float_rows(session, stmt, len(columns) + 1)
    return GpuSeries(uuid=gpu.uuid, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes, ts=data[:, 0],
                     columns={c: data[:, i + 1] for i, c in enumerate(columns)}, power_source=gpu.power_source)


def _load_steps(session: Session, job: Job) -> StepSeries | None:
    rows = session.execute(
        select(JobStep.rank, JobStep.step, epoch_column(session, JobStep.__table__.c.ts), JobStep.wall_s,
               JobStep.device_s, JobStep.samples, JobStep.allocated_peak_bytes, JobStep.reserved_peak_bytes)
        .where(JobStep.job_pk == job.id).order_by(JobStep.rank, JobStep.step)
    ).all()
    if not rows:
        return None
    a = np.array(rows, dtype=np.float64)
    source = session.scalar(select(JobStep.memory_source).where(JobStep.job_pk == job.id,
                                                                JobStep.memory_source.is_not(None)).limit(1))
    return StepSeries(rank=a[:, 0].astype(np.int64), step=a[:, 1].astype(np.int64), ts=a[:, 2], wall_s=a[:, 3],
                      device_s=a[:, 4], samples=a[:, 5], allocated_peak_bytes=a[:, 6], reserved_peak_bytes=a[:, 7],
                      memory_source=source)


def _load_layers(session: Session, job: Job) -> list[LayerRow]:
    rows = session.execute(
        select(LayerStat.module, func.max(LayerStat.module_type), func.avg(LayerStat.forward_s),
               func.avg(LayerStat.backward_s), func.max(LayerStat.activation_bytes), func.sum(LayerStat.calls))
        .where(LayerStat.job_pk == job.id).group_by(LayerStat.module)
    ).all()
    return [LayerRow(module=m, module_type=t, forward_s=f, backward_s=b,
                     activation_bytes=None if a is None else int(a), calls=int(c or 0)) for m, t, f, b, a, c in rows]


def load_job_data(session: Session, job: Job, settings: ServerSettings, *, now: float) -> JobData:
    now_dt = from_epoch(now)
    assert now_dt is not None
    gpus = [load_gpu_series(session, gpu, start, end) for gpu, start, end in job_gpu_windows(session, job, now=now_dt)]
    oom = session.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.job_pk == job.id,
                                                                          JobEvent.kind == "oom")) or 0
    return JobData(
        job_id=job.job_id, state=job.state, name=job.name, team=job.team, started_at=to_epoch(job.started_at),
        ended_at=to_epoch(job.ended_at), exit_code=job.exit_code, batch_size=job.batch_size,
        gpu_type_requested=job.gpu_type_requested, gpus_requested=job.gpus_requested, gpus=gpus,
        steps=_load_steps(session, job), layers=_load_layers(session, job), oom_events=int(oom),
        # Uploaded traces are merged after characterization (server.analysis.trace_sections).
        trace_summaries=[],
        energy_settings=EnergySettings(grid_intensity_g_per_kwh=settings.grid_intensity_g_per_kwh, pue=settings.pue,
                                       price_per_kwh_usd=settings.price_per_kwh_usd),
    )


def compute_report(session: Session, job: Job, settings: ServerSettings) -> dict:
    """Characterize now and store the result (idempotent: same data, same report)."""
    now = time.time()
    report = characterize_mod.characterize(load_job_data(session, job, settings, now=now), now=now)
    traces = [t.summary | {"kind": t.kind, "filename": t.filename, "rank": t.rank}
              for t in session.scalars(select(Trace).where(Trace.job_pk == job.id).order_by(Trace.id))]
    merge_trace_sections(report, traces)
    report.setdefault("team", job.team)
    report.setdefault("name", job.name)
    # An upsert: the worker (or the in-process task) and a reader may characterize the same job at once.
    ins = pg_insert if is_postgres(session) else sqlite_insert
    stmt = ins(Report).values(job_pk=job.id, analyzer_version=characterize_mod.ANALYZER_VERSION,
                              computed_at=from_epoch(now), data=report, fleet_row=job_fleet_row(report))
    session.execute(stmt.on_conflict_do_update(index_elements=["job_pk", "analyzer_version"],
                                               set_={"computed_at": stmt.excluded.computed_at,
                                                     "data": stmt.excluded.data,
                                                     "fleet_row": stmt.excluded.fleet_row}))
    session.expire_all()
    return report


def cached_report(session: Session, job: Job) -> Report | None:
    return session.get(Report, (job.id, characterize_mod.ANALYZER_VERSION))


def is_final(report: Report, job: Job) -> bool:
    """A report of an ended job, computed after the late-data window and after the job's last update."""
    if job.state not in TERMINAL_STATES or job.ended_at is None:
        return False
    return report.computed_at >= job.ended_at + LATE_DATA_WINDOW and report.computed_at >= job.updated_at


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


class InputsCache:
    """Process-local LRU of cached reports' `rightsizing_inputs`, keyed by what identifies one stored report:
    (database, job_pk, analyzer version, computed_at). A recomputed report has a new computed_at, so an entry is
    never stale, only unused until evicted.

    Why: the inputs sit inside the report document (~70 KiB for 2 h x 8 GPUs), and Postgres decompresses a
    whole TOASTed JSONB value to read one key: 50 runs of history cost ~7 ms per request that way, ~0.1 ms
    from here. Entries are small (a few hundred bytes plus one peak per hour of the run)."""

    def __init__(self, max_entries: int = 50_000):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[Any, ...], Mapping[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], Mapping[str, Any]]:
        with self._lock:
            found = {k: self._entries[k] for k in keys if k in self._entries}
            for k in found:
                self._entries.move_to_end(k)
        return found

    def put(self, key: tuple[Any, ...], value: Mapping[str, Any]) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


RIGHTSIZING_INPUTS = InputsCache()


def has_report(session: Session, job: Job) -> bool:
    """Whether the job has a cached report of this analyzer version (without reading the document)."""
    return session.scalar(select(Report.computed_at).where(
        Report.job_pk == job.id, Report.analyzer_version == characterize_mod.ANALYZER_VERSION)) is not None


def rightsizing_history(session: Session, job: Job, *, limit: int,
                        cache: InputsCache = RIGHTSIZING_INPUTS) -> list[tuple[str, Mapping[str, Any]]]:
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
    return [(job_id, found[k]) for (job_id, _, _), k in zip(rows, keys) if k in found][::-1]


def bucket_width_s(span_s: float, points: int) -> float:
    """Bucket width so that `span_s` fills points // 2 buckets (two points each: min and max), the span's last
    instant still inside the last one (1 ms of slack: SQLite's epoch seconds come through julianday)."""
    return span_s / max(points // 2, 1) + 1e-3


def time_buckets(session: Session, ts: Any, start: datetime, width_s: float) -> tuple[Any, Any, Any]:
    """SQL expressions (bucket key, first ts, last ts) for `width_s`-second buckets from `start`, the first and
    last timestamps as epoch seconds: the one rule for the time buckets of plotted series.

    Postgres buckets the timestamp itself with date_bin: converting every row to epoch seconds first (EXTRACT is
    numeric since PG 14) cost three times the scan of a 24 h x 1 Hz series. Only the bucket rows are converted.
    """
    if is_postgres(session):
        bucket = func.date_bin(func.make_interval(0, 0, 0, 0, 0, 0, width_s), ts, start)
        return bucket, cast(extract("epoch", func.min(ts)), Float), cast(extract("epoch", func.max(ts)), Float)
    ts_s = epoch_column(session, ts)
    return func.floor((ts_s - start.timestamp()) / width_s), func.min(ts_s), func.max(ts_s)


def downsampled_series(session: Session, gpu: Gpu, start: datetime, end: datetime,
                 points: dict[str, int]) -> dict[str, tuple[list[float], list[float], int]]:
    """Per metric: (ts, values, raw count), at most ~its `points`, bucketed in SQL: each time bucket gives its
    minimum at the bucket's first timestamp and its maximum at its last, so extremes survive exactly and a
    24 h x 1 Hz series never travels to Python row by row.

    One scan for every metric (next to reading the rows, more aggregates cost next to nothing): buckets at the
    finest resolution asked for; a metric asked at a coarser one merges whole runs of them, exactly."""
    t = GpuSample.__table__
    cols = {m: t.c[m] for m in points}
    where = (t.c.gpu_id == gpu.id, t.c.ts >= start, t.c.ts <= end)
    finest = max(points.values())
    width_s = bucket_width_s((end - start).total_seconds(), finest)
    bucket, first, last = time_buckets(session, t.c.ts, start, width_s)
    rows = session.execute(
        select(bucket.label("b"), first, last, *(a for c in cols.values()
                                                 for a in (func.count(c), func.min(c), func.max(c))))
        .where(*where).group_by("b").order_by("b")).all()
    index = [int(b) if isinstance(b, (int, float)) else round((b - start).total_seconds() / width_s)
             for b, *_ in rows]
    out: dict[str, tuple[list[float], list[float], int]] = {}
    for i, (metric, budget) in enumerate(points.items()):
        aggs = [(index[j], r[1], r[2], r[3 + 3 * i], r[4 + 3 * i], r[5 + 3 * i]) for j, r in enumerate(rows)]
        raw = sum(a[3] for a in aggs)
        if raw <= budget:
            continue  # sent as is, below
        merge = max(1, round((finest // 2) / max(budget // 2, 1)))  # fine buckets per bucket of this metric
        merged: dict[int, list[Any]] = {}
        for idx, first_s, last_s, n, lo, hi in aggs:
            if not n:
                continue
            m = merged.get(idx // merge)
            if m is None:
                merged[idx // merge] = [first_s, last_s, n, lo, hi]
            else:
                m[1], m[2], m[3], m[4] = last_s, m[2] + n, min(m[3], lo), max(m[4], hi)
        ts_out: list[float] = []
        v_out: list[float] = []
        for first_s, last_s, n, lo, hi in merged.values():
            ts_out.append(float(first_s))
            v_out.append(float(lo))
            if n > 1:
                ts_out.append(float(last_s))
                v_out.append(float(hi))
        out[metric] = (ts_out, v_out, raw)
    as_is = [m for m in points if m not in out]
    if as_is:
        samples = session.execute(select(epoch_column(session, t.c.ts), *(cols[m] for m in as_is))
                                  .where(*where).order_by(t.c.ts)).all()
        for i, metric in enumerate(as_is, start=1):
            pairs = [(float(r[0]), float(r[i])) for r in samples if r[i] is not None]
            out[metric] = ([p[0] for p in pairs], [p[1] for p in pairs], len(pairs))
    return {m: out[m] for m in points}
