"""Fleet rollups and the fleet summary. The definitions live in server.analysis.fleet.rollup (pure, validated on real
cluster series); this module only moves data between Postgres and those functions.

- `rollup_hours`: raw samples of the touched hours -> per GPU, `reduce_hours` -> `gpu_hourly`, and the same
  split by the job↔GPU windows (`attributed_rollup`) -> `gpu_job_hourly` (both replaced).
- `rollup_rows`: hourly rows per GPU, node (`gpu_hourly`) or team (`gpu_job_hourly`), summed in SQL.
- `summary`: `gpu_hourly` summed in SQL to the few totals the summary needs (10,000 GPUs x 24 h is one aggregate,
  not 240,000 rows in Python), latest utilization per GPU, and per-job rows from cached reports ->
  `summary_from_totals` (server.analysis.fleet.rollup.fleet_summary's second half).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Float, Numeric, Text, and_, case, cast, delete, func, or_, select, text, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import Label

from server.analysis import characterize as characterize_mod
from server.analysis.energy.accounting import IDLE_UTIL_PCT
from server.analysis.fleet.goodput import goodput_figures
from server.analysis.fleet.rollup import (
    ENERGY_SOURCE,
    ENERGY_SOURCES,
    GOODPUT_FIELDS,
    ROLLUP_FIELDS,
    attributed_rollup,
    attribution_weights,
    gpus_now,
    group_figures,
    job_figures,
    job_fleet_row,
    reduce_hours,
    sample_terms,
    summary_from_totals,
)
from server.analysis.health.findings import slowdown_threshold
from server.auth.policy import link_window
from server.db import dialect_insert, epoch_column, float_rows, is_postgres, read_in_parallel, rowcount
from server.models import Gpu, GpuHourly, GpuJobHourly, GpuSample, Job, JobGpu, Node, Report, RollupBacklog
from server.models.base import from_epoch
from server.nodes.attention import ATTENTION_WINDOW_S, attention_list
from server.storage.bulk import insert_ignore
from server.storage.partitions import DAY_S, day_of

log = logging.getLogger(__name__)

HOUR_S = 3600.0
CURRENT_WINDOW_S = 300.0  # a GPU's "now" is its latest sample within this many seconds of now
# One interval past the end is read so that the last interval of the last hour has its closing sample.
LOOKAHEAD_S = 120.0
ROLLUP_GPUS_PER_RANGE = 200  # GPU ids per rollup range: the raw samples one rollup read holds in memory
RECENT_HOURS = 2  # the periodic sweep re-rolls this many hours back from now
LATE_AFTER_S = 3600.0  # samples older than this on arrival go to the rollup backlog (well inside RECENT_HOURS)
ROLLUP_LOCK_NS = 0x666C7072  # "flpr": the namespace of rollup_hours' per-range transaction-level advisory locks


def _job_windows(session: Session, *, since: float, until: float,
                 now: float) -> dict[int, list[tuple[int, float, float]]]:
    """gpu_id -> [(job_pk, start, end)]: the job↔GPU windows (server.auth.policy.link_window) overlapping
    [since, until], as epoch seconds."""
    rows = session.execute(
        select(JobGpu, Job).join(Job, Job.id == JobGpu.job_pk)
        .where(or_(Job.ended_at.is_(None), Job.ended_at >= from_epoch(since)),
               or_(Job.started_at.is_(None), Job.started_at <= from_epoch(until)))
    ).all()
    now_dt = from_epoch(now)
    assert now_dt is not None
    out: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
    for link, job in rows:
        window = link_window(job, link, now=now_dt)
        if window is None:
            continue
        start, end = window[0].timestamp(), window[1].timestamp()
        if end >= since and start <= until:
            out[link.gpu_id].append((job.id, start, end))
    return out


def _append_rows(columns: dict[str, list[Any]], r: dict[str, Any], keep: np.ndarray,
                 integer_fields: frozenset[str]) -> None:
    """Rows `keep` of a rollup table onto column lists, NaN as None (the database's null)."""
    for field, values in columns.items():
        if field not in r:
            continue
        kept = r[field][keep]
        if r[field].dtype == object:
            values.extend(kept.tolist())
        elif field in integer_fields:
            values.extend(None if np.isnan(v) else int(v) for v in kept)
        else:
            values.extend(None if np.isnan(v) else float(v) for v in kept)


def rollup_ranges(session: Session) -> list[int]:
    """The GPU ranges that hold GPUs: range k is the GPU ids [k·W + 1, (k + 1)·W], W = ROLLUP_GPUS_PER_RANGE.
    Fixed by id, so a range means the same GPUs in every sweep, whoever runs it."""
    return list(session.scalars(select(func.distinct((Gpu.id - 1) // ROLLUP_GPUS_PER_RANGE)).order_by(
        (Gpu.id - 1) // ROLLUP_GPUS_PER_RANGE)))


def rollup_hours(session: Session, *, since: float, until: float, now: float | None = None,
                 ranges: list[int] | None = None) -> int:
    """(Re)compute gpu_hourly and gpu_job_hourly for the hours in [floor(since), ceil(until)), GPU range by GPU
    range (`rollup_ranges`; `ranges`: only these, a worker's share of a fanned-out sweep). Idempotent. `now`:
    where the window of a job still running ends (default: the clock). Returns the gpu_hourly rows written.

    Memory is bounded by one range's raw samples (at 1 Hz, 3 h of 10,000 GPUs is 108 M rows; one range ~2 M),
    and each range is one primary-key range scan per partition."""
    now = time.time() if now is None else now
    h0 = since - since % HOUR_S
    h1 = until - until % HOUR_S + HOUR_S
    windows = _job_windows(session, since=h0, until=h1 + LOOKAHEAD_S, now=now)
    written = 0
    for k in rollup_ranges(session) if ranges is None else ranges:
        first_id, last_id = k * ROLLUP_GPUS_PER_RANGE + 1, (k + 1) * ROLLUP_GPUS_PER_RANGE
        if is_postgres(session):
            # One rollup of a range at a time: gpu_job_hourly has no natural key to de-duplicate on, so two
            # overlapping runs (a beat tick while a retry still runs) must not both insert after both deleted.
            session.execute(text("SELECT pg_advisory_xact_lock(:ns, :k)"), {"ns": ROLLUP_LOCK_NS, "k": k})
        # Backlog of these hours first, samples after: samples committed meanwhile are either read below or leave
        # a backlog row of their own for the next sweep.
        session.execute(delete(RollupBacklog).where(RollupBacklog.range_k == k, RollupBacklog.hour >= from_epoch(h0),
                                                    RollupBacklog.hour < from_epoch(h1)))
        for table in (GpuHourly, GpuJobHourly):
            session.execute(delete(table).where(table.hour >= from_epoch(h0), table.hour < from_epoch(h1),
                                                table.gpu_id >= first_id, table.gpu_id <= last_id))
        written += _rollup_gpu_range(session, first_id, last_id, h0=h0, h1=h1, windows=windows)
    return written


def note_late_samples(session: Session, gpu_ids: list[int], ts: list[float], *, now: float) -> int:
    """Ingest: samples older than LATE_AFTER_S put their (GPU range, hour) in the rollup backlog, since the
    periodic sweep (the last RECENT_HOURS hours) may have passed them already. Returns the pairs noted."""
    cutoff = now - LATE_AFTER_S
    if not ts or min(ts) >= cutoff:
        return 0
    t = np.asarray(ts, dtype=np.float64)
    late = t < cutoff
    pairs = np.unique(np.column_stack([(np.asarray(gpu_ids, dtype=np.int64)[late] - 1) // ROLLUP_GPUS_PER_RANGE,
                                       (t[late] // HOUR_S).astype(np.int64)]), axis=0)
    session.execute(dialect_insert(session)(RollupBacklog).on_conflict_do_nothing(),
                    [{"range_k": int(k), "hour": from_epoch(float(h) * HOUR_S)} for k, h in pairs])
    return len(pairs)


def backlog_spans(session: Session, *, now: float, raw_retention_days: int) -> list[tuple[int, float, float]]:
    """The rollup backlog as (GPU range, first hour, last hour) runs of consecutive hours, for rollup_hours.
    Hours whose raw samples retention may have dropped (the original ones gone, only the late ones left) are
    not rolled up again, which would replace their rollups by a part of them: their backlog rows are dropped."""
    oldest = (day_of(now) - raw_retention_days + 1) * DAY_S
    stale = session.execute(delete(RollupBacklog).where(RollupBacklog.hour < from_epoch(oldest)))
    if rowcount(stale):
        log.warning("rollup backlog: %d GPU-range hours older than the raw retention were not rolled up again",
                    rowcount(stale))
    spans: list[tuple[int, float, float]] = []
    for k, hour in session.execute(select(RollupBacklog.range_k, epoch_column(session, RollupBacklog.hour))
                                   .order_by(RollupBacklog.range_k, RollupBacklog.hour)):
        h = round(float(hour) / HOUR_S) * HOUR_S
        if spans and spans[-1][0] == k and spans[-1][2] == h - HOUR_S:
            spans[-1] = (k, spans[-1][1], h)
        else:
            spans.append((k, h, h))
    return spans


def _rollup_gpu_range(session: Session, first_id: int, last_id: int, *, h0: float, h1: float,
                      windows: dict[int, list[tuple[int, float, float]]]) -> int:
    """rollup_hours for the GPUs with first_id <= id <= last_id; returns the gpu_hourly rows written."""
    t = GpuSample.__table__
    a = float_rows(session, select(
        t.c.gpu_id, epoch_column(session, t.c.ts), t.c.gpu_util_pct,
        func.coalesce(t.c.memory_used_max_bytes, t.c.memory_used_bytes), t.c.power_w, t.c.energy_counter_j,
        t.c.throttle_reasons, t.c.temperature_c)
        .where(t.c.gpu_id >= first_id, t.c.gpu_id <= last_id,
               t.c.ts >= from_epoch(h0), t.c.ts < from_epoch(h1 + LOOKAHEAD_S)).order_by(t.c.gpu_id, t.c.ts), 8)
    if not a.size:
        return 0
    thresholds = {gpu_id: slowdown_threshold(nvml_c, name).value for gpu_id, nvml_c, name in session.execute(
        select(Gpu.id, Gpu.slowdown_temperature_c, Gpu.name).where(Gpu.id >= first_id, Gpu.id <= last_id)).tuples()}
    fields = [*ROLLUP_FIELDS, ENERGY_SOURCE]
    per_gpu: dict[str, list[Any]] = {"gpu_id": [], **{f: [] for f in fields}}
    per_job: dict[str, list[Any]] = {"gpu_id": [], "key": [], **{f: [] for f in fields}}
    bounds = np.flatnonzero(np.diff(a[:, 0])) + 1
    for part in np.split(a, bounds):
        gpu_id = int(part[0, 0])
        terms = sample_terms(part[:, 1], gpu_util_pct=part[:, 2], memory_used_bytes=part[:, 3], power_w=part[:, 4],
                             energy_counter_j=part[:, 5], throttle_reasons=part[:, 6], temperature_c=part[:, 7],
                             slowdown_temperature_c=thresholds.get(gpu_id))
        r = reduce_hours(terms)
        keep = (r["hour_start"] >= h0) & (r["hour_start"] < h1)
        per_gpu["gpu_id"].extend([gpu_id] * int(keep.sum()))
        _append_rows(per_gpu, r, keep, frozenset({"samples", "memory_peak_bytes"}))
        keys, weights = attribution_weights(part[:, 1], windows.get(gpu_id, ()))
        j = attributed_rollup(terms, keys, weights)
        keep = (j["hour_start"] >= h0) & (j["hour_start"] < h1)
        per_job["gpu_id"].extend([gpu_id] * int(keep.sum()))
        _append_rows(per_job, j, keep, frozenset({"memory_peak_bytes"}))
    hour = frozenset({"hour"})
    rename = {"hour_start": "hour", "key": "job_pk"}
    insert_ignore(session, GpuJobHourly.__table__, [rename.get(n, n) for n in per_job], list(per_job.values()),
                  time_columns=hour)
    return insert_ignore(session, GpuHourly.__table__, [rename.get(n, n) for n in per_gpu], list(per_gpu.values()),
                         time_columns=hour)


def _gpus_now(session: Session, now: float) -> dict[str, int]:
    """server.analysis.fleet.rollup.gpus_now over each GPU's latest sample within CURRENT_WINDOW_S of `now` (GPUs
    without one are not counted). The window is bounded on both sides: a sample stamped further ahead (a skewed clock)
    is not "now", and the bound keeps the beat's pre-created partitions of the coming days out of every probe."""
    in_window = and_(GpuSample.ts >= from_epoch(now - CURRENT_WINDOW_S),
                     GpuSample.ts <= from_epoch(now + CURRENT_WINDOW_S))
    if not is_postgres(session):
        latest_ts = (select(GpuSample.gpu_id, func.max(GpuSample.ts).label("ts"))
                     .where(in_window).group_by(GpuSample.gpu_id).subquery())
        utils = session.scalars(
            select(GpuSample.gpu_util_pct)
            .join(latest_ts, and_(GpuSample.gpu_id == latest_ts.c.gpu_id, GpuSample.ts == latest_ts.c.ts))
            .join(Gpu, Gpu.id == GpuSample.gpu_id).where(in_window)).all()
        return gpus_now({str(i): u for i, u in enumerate(utils)})  # keys only tell the GPUs apart
    # One primary-key probe per GPU (its newest sample, LIMIT 1) in the partitions the constant bounds leave, counted
    # in SQL by gpus_now's rule: 10,000 GPUs ~37 ms (~70 ms shipping the 10,000 rows; ~80 ms more when the empty
    # days ahead were probed too), where grouping read every sample of the window (3 M rows at 1 Hz).
    latest = (select(GpuSample.gpu_util_pct).where(GpuSample.gpu_id == Gpu.id, in_window)
              .order_by(GpuSample.ts.desc()).limit(1).lateral("latest"))
    util = latest.c.gpu_util_pct
    idle, unknown = session.execute(
        select(func.count().filter(util < IDLE_UTIL_PCT), func.count().filter(util.is_(None)))
        .select_from(Gpu).join(latest, true())).one()
    return {"idle_gpus_now": int(idle), "gpus_unknown_now": int(unknown)}


def first_hour(start: float) -> float:
    """The first hour *starting* in a window that starts at `start` (fleet_summary's and the rollups' rule)."""
    hour0 = start - start % HOUR_S
    return hour0 if hour0 >= start else hour0 + HOUR_S


ROLLUP_KEYS = ("gpu", "node", "team")


def rollup_rows(session: Session, *, by: str, window_s: float, now: float, limit: int, offset: int) -> dict[str, Any]:
    """Hourly rows per GPU, node or team over the hours starting in [now - window_s, now), summed in SQL and
    turned into figures by server.analysis.fleet.rollup.group_figures.

    gpu and node rows come from `gpu_hourly`; team rows from `gpu_job_hourly` grouped by the job's team, the
    time outside every job (and of jobs with no team) under team None.
    """
    if by not in ROLLUP_KEYS:
        raise ValueError(by)
    per_job = by == "team"
    t = (GpuJobHourly if per_job else GpuHourly).__table__
    source = func.coalesce(t.c.energy_source, case((t.c.energy_j.is_(None), "unknown"), else_="unrecorded"))
    util_known = t.c.util_mean_pct.is_not(None)
    sums = [
        func.count(func.distinct(t.c.gpu_id)).label("gpus"),
        func.sum(t.c.covered_s).label("covered_s"),
        func.sum(t.c.busy_s).label("busy_s"),
        func.sum(t.c.util_busy_s).label("util_busy_s"),
        func.sum(t.c.energy_j).label("energy_j"),
        func.max(t.c.memory_peak_bytes).label("memory_peak_bytes"),
        func.sum(t.c.util_mean_pct * t.c.covered_s).label("util_mean_weighted"),
        func.sum(case((util_known, t.c.covered_s))).label("util_covered_s"),
        *(func.sum(case((source == name, t.c.covered_s))).label(f"src_{name}") for name in ENERGY_SOURCES),
    ]
    keys: list[Label[Any]]
    if by == "gpu":
        keys = [Node.name.label("node"), Gpu.uuid.label("gpu_uuid"), Gpu.index.label("gpu_index")]
    elif by == "node":
        keys = [Node.name.label("node")]
    else:
        keys = [Job.team.label("team")]
        sums.append(func.count(func.distinct(t.c.job_pk)).label("jobs"))
    stmt = select(t.c.hour, *keys, *sums)
    if per_job:
        stmt = stmt.select_from(t).outerjoin(Job, Job.id == t.c.job_pk)
    else:
        stmt = stmt.select_from(t).join(Gpu, Gpu.id == t.c.gpu_id).join(Node, Node.id == Gpu.node_id)
    stmt = (stmt.where(t.c.hour >= from_epoch(first_hour(now - window_s)), t.c.hour < from_epoch(now))
            .group_by(t.c.hour, *keys))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    out_rows = []
    for row in session.execute(stmt.order_by(t.c.hour, *keys).limit(limit).offset(offset)).mappings():
        ident = {k: row[k] for k in ("node", "gpu_uuid", "gpu_index", "team") if k in row}
        key = f"{row['node']}/{row['gpu_uuid']}" if by == "gpu" else (row["node"] if by == "node" else row["team"])
        figures = group_figures(
            covered_s=row["covered_s"] or 0.0, busy_s=row["busy_s"], util_busy_s=row["util_busy_s"],
            energy_j=row["energy_j"], memory_peak_bytes=row["memory_peak_bytes"],
            util_mean_weighted=row["util_mean_weighted"], util_covered_s=row["util_covered_s"],
            energy_source_s={name: row[f"src_{name}"] for name in ENERGY_SOURCES})
        extra = {"jobs": row["jobs"]} if per_job else {}
        out_rows.append({"hour_start": row["hour"].timestamp(), "key": key, **ident, "gpus": row["gpus"], **extra,
                         **figures})
    return {
        "by": by, "window_s": window_s, "generated_at": now, "total": total, "limit": limit, "offset": offset,
        "rows": out_rows,
        "sources": {
            "gpu_hours": "hourly rollups of NVML samples (sample-and-hold time)",
            "busy_gpu_hours": "time with gpu_util_pct >= idle threshold",
            "util_mean_pct": "time-weighted mean of the GPUs' hourly sample means of gpu_util_pct",
            "energy_j": "hardware energy counter deltas, else integrated power; energy_source_gpu_hours says "
                        "which, per GPU-hour",
            "memory_used_max_bytes": "largest single-GPU NVML memory used (interval maximum where sent)",
            **({"team": "job↔GPU windows (job_gpus, the reports' rule); a sample shared by n jobs counts 1/n "
                        "to each; null: time outside every job, or of jobs without a team"} if per_job else {}),
        },
    }


def _window_reports(since: datetime) -> Any:
    """The conditions on (Report joined to Job) for the current reports of the jobs active since `since`."""
    return and_(Job.ended_at.is_(None) | (Job.ended_at >= since),
                Report.analyzer_version == characterize_mod.ANALYZER_VERSION)


def _rows_from_documents(session: Session, pks: list[int]) -> dict[int, dict[str, Any]]:
    """job_pk -> job_fleet_row of its current report's document: for reports stored before `fleet_row` (or one
    of its keys) existed."""
    out: dict[int, dict[str, Any]] = {}
    for i in range(0, len(pks), 1000):
        docs = session.execute(select(Report.job_pk, Report.data).where(
            Report.job_pk.in_(pks[i:i + 1000]), Report.analyzer_version == characterize_mod.ANALYZER_VERSION))
        out.update((pk, job_fleet_row(d)) for pk, d in docs)
    return out


def job_rows(session: Session, since: datetime, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The fleet rows (server.analysis.fleet.rollup.job_fleet_row) of the current reports of jobs active since `since`,
    newest jobs first when `limit` is given: the stored `fleet_row`, derived from the document only for reports
    stored before that column (or one of its keys) existed."""
    # As text, parsed by orjson: the driver's per-row json.loads cost more than the query (5,000 jobs: 60 ms).
    query = (select(Report.job_pk, cast(Report.fleet_row, Text)).join(Job, Job.id == Report.job_pk)
             .where(_window_reports(since)))
    if limit is not None:
        query = query.order_by(Job.id.desc()).limit(limit)
    parsed = [(pk, orjson.loads(row) if row is not None else None) for pk, row in session.execute(query).all()]
    out: dict[int, dict[str, Any]] = {pk: r for pk, r in parsed if r is not None and r.keys() >= FLEET_ROW_KEYS}
    out.update(_rows_from_documents(session, [pk for pk, _ in parsed if pk not in out]))
    return [out[pk] for pk, _ in parsed if pk in out]


# The keys a stored fleet row must have to be used as is (older rows lack the later ones).
FLEET_ROW_KEYS = frozenset(job_fleet_row({}))


def _summary_job_figures(session: Session, since: datetime, top_n: int = 10) -> dict[str, Any]:
    """server.analysis.fleet.rollup.job_figures of the window's jobs. On Postgres the stored fleet rows are summed and
    ranked in SQL (5,000 jobs: ~30 ms instead of ~65 ms of parsing every row in Python), and only the reports
    without a complete fleet row go through job_figures; SQLite: job_figures over job_rows."""
    if not is_postgres(session):
        return job_figures(job_rows(session, since), top_n=top_n)
    row = Report.fleet_row
    complete = func.coalesce(row.op("?&", is_comparison=True)(postgresql.array(sorted(FLEET_ROW_KEYS))), False)
    reports = select().select_from(Report).join(Job, Job.id == Report.job_pk).where(_window_reports(since))
    # One scan: the stranded bytes of the complete rows, and which reports have none.
    stranded, older_pks = session.execute(reports.add_columns(
        func.sum(cast(row["memory_stranded_bytes"].as_string(), Numeric)).filter(complete),
        func.array_agg(Report.job_pk).filter(~complete))).one()
    # The top rows by wasted GPU-hours, ranked on the number alone: only those rows are turned into text.
    wasted = cast(row["wasted_gpu_hours"].as_string(), Float)
    top_pks = (reports.add_columns(Report.job_pk).where(complete, wasted.is_not(None))
               .order_by(wasted.desc(), Report.job_pk.desc()).limit(top_n))
    top = [orjson.loads(r) for r in session.scalars(
        select(cast(row, Text)).where(Report.job_pk.in_(top_pks),
                                      Report.analyzer_version == characterize_mod.ANALYZER_VERSION))]
    older = list(_rows_from_documents(session, older_pks or []).values())
    figures = job_figures([*top, *older], top_n=top_n)
    known = [v for v in (stranded, job_figures(older)["memory_stranded_bytes"]) if v is not None]
    figures["memory_stranded_bytes"] = int(sum(known)) if known else None
    return figures


def summary(session: Session, *, window_s: float, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    start = now - window_s
    since = from_epoch(start)
    # Four independent reads: on Postgres three run on connections of their own while this one sums the rollups
    # (10,000 GPUs x 24 h, 5,000 jobs: GPUs now ~37 ms, rollup sums ~45, GPUs in the window ~35, job
    # figures ~30, overlapped on as many cores as there are).
    now_read = read_in_parallel(session, _gpus_now, now)
    goodput_read = read_in_parallel(session, _goodput, start, now)
    attention_window = min(window_s, ATTENTION_WINDOW_S)
    attention_read = read_in_parallel(session, lambda s: attention_list(s, now=now, window_s=attention_window))
    jobs_read = read_in_parallel(session, _summary_job_figures, since)
    hours = and_(GpuHourly.hour >= from_epoch(first_hour(start)), GpuHourly.hour < from_epoch(now))
    # GPUs with rollups in the window: one primary-key probe per GPU (count(DISTINCT) sorted every row: ~75 ms).
    gpus_read = read_in_parallel(session, lambda s: s.scalar(select(func.count()).select_from(Gpu).where(
        select(GpuHourly.gpu_id).where(GpuHourly.gpu_id == Gpu.id, hours).exists())))
    # The sums fleet_summary needs, as one row: 10,000 GPUs x 24 h is one aggregate, not rows shipped to Python.
    # Hours are counted as fleet_summary counts them (first_hour).
    row = session.execute(select(func.sum(GpuHourly.covered_s), func.sum(GpuHourly.busy_s),
                                 func.sum(GpuHourly.util_busy_s), func.sum(GpuHourly.energy_j)).where(hours)).one()
    totals = {"gpus": int(gpus_read.result() or 0), "covered_s": float(row[0] or 0.0),
              **{k: None if v is None else float(v)
                 for k, v in zip(("busy_s", "util_busy_s", "energy_j"), row[1:], strict=True)}}
    out = summary_from_totals(totals, window_s=window_s, gpus_now=now_read.result(),
                              jobs=jobs_read.result())
    fleet_goodput, by_team = goodput_read.result()
    out["goodput"] = fleet_goodput
    out["goodput_by_team"] = by_team
    out["attention_window_s"] = attention_window
    out["gpus_needing_attention"] = [a.model_dump() for a in attention_read.result()]
    out["window_s"] = window_s
    out["generated_at"] = now
    out["gpus_total"] = session.scalar(select(func.count()).select_from(Gpu)) or 0
    out["sources"] = {
        "gpu_hours": "hourly rollups of NVML samples (sample-and-hold time)",
        "busy_gpu_hours": "time with gpu_util_pct >= idle threshold",
        "energy_j": "hardware energy counter deltas, else integrated power, per rollup hour",
        "memory_stranded_bytes": "job reports: GPU capacity - NVML peak used, summed over jobs in the window",
        "goodput": "hourly job rollups (gpu_job_hourly) of NVML gpu_util_pct and clock event reasons: idle (< idle "
                   "threshold for 60 s or more), input-stalled (no kernel while the job ran), throttled (kernel time "
                   "under a slowdown reason), productive; unknown: utilization unknown or rolled up before goodput",
        "gpus_needing_attention": "over the last attention_window_s: slowdown seconds from the hourly rollups; XID, "
                                  "ECC / retired pages / row remapping / PCIe replay / NVLink counters and flags from "
                                  "each GPU's first and last NVML sample of the window",
    }
    return out


def _goodput(session: Session, start: float, now: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """server.analysis.fleet.goodput figures of the allocated time (rows of a job) in the hours starting in the
    window, for the fleet and per team: one aggregate grouped by team."""
    t = GpuJobHourly.__table__
    sums = [func.sum(t.c.covered_s).label("covered_s"), *(func.sum(t.c[f]).label(f) for f in GOODPUT_FIELDS)]
    rows = session.execute(
        select(Job.team, *sums).select_from(t).join(Job, Job.id == t.c.job_pk)
        .where(t.c.hour >= from_epoch(first_hour(start)), t.c.hour < from_epoch(now)).group_by(Job.team)
        .order_by(Job.team)).mappings().all()
    fleet = {k: sum(float(r[k] or 0.0) for r in rows) for k in ("covered_s", *GOODPUT_FIELDS)}
    return goodput_figures(fleet), [{"team": r["team"], **goodput_figures(dict(r))} for r in rows]
