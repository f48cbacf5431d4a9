"""A job's report: computed (loader -> pure characterization) and stored, read back while it is final.

A report is final once the job ended, its late-data window closed and the job has not changed since.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.analysis import characterize as characterize_mod
from server.analysis.fleet.rollup import job_fleet_row
from server.analysis.planning.fit_advice import fit_recommendations
from server.analysis.traces.captures import CaptureRow, captures_section
from server.analysis.traces.sections import merge_trace_sections
from server.config import ServerSettings
from server.db import dialect_insert, session_scope
from server.jobs import plot_views
from server.jobs.loader import job_gpu_windows, load_job_data
from server.models import TERMINAL_STATES, Capture, Job, Report, Trace
from server.models.base import from_epoch, to_epoch

# Samples may reach the server after the job ended (an agent's spool draining after an outage): a report
# computed within this window after the end is not final, and is recomputed when asked for.
LATE_DATA_WINDOW = timedelta(minutes=5)


def compute_report(session: Session, job: Job, settings: ServerSettings) -> dict:
    """Characterize now and store the result (idempotent: same data, same report)."""
    now = time.time()
    running = job.state not in TERMINAL_STATES
    report = characterize_mod.characterize(load_job_data(session, job, settings, now=now, incremental=running),
                                           now=now)
    captures = list(session.scalars(select(Capture).where(Capture.job_pk == job.id)
                                    .order_by(Capture.requested_at.desc(), Capture.id.desc())))
    summaries = _trace_summaries(session, job)
    captured = {tid for c in captures for tid in c.trace_ids or []}
    # A live capture's traces are shown per capture (a capture traces its ranks again: they do not combine with the
    # job's own profile uploads)
    merge_trace_sections(report, [s for tid, s in summaries.items() if tid not in captured])
    section = captures_section([_capture_row(c) for c in captures], summaries)
    report["captures"] = None if section is None else section.model_dump(mode="json")
    # near or past capacity: needs the layer table and the trace's breakdown, so after the merge
    report["recommendations"] = [*(report.get("recommendations") or []),
                                 *(r.model_dump(mode="json") for r in fit_recommendations(report))]
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


def _trace_summaries(session: Session, job: Job) -> dict[int, dict]:
    """The job's uploads' stored summaries by trace id, each with its kind, filename and rank."""
    return {t.id: t.summary | {"kind": t.kind, "filename": t.filename, "rank": t.rank}
            for t in session.scalars(select(Trace).where(Trace.job_pk == job.id).order_by(Trace.id))}


def profile_kineto_summaries(session: Session, job: Job) -> list[dict]:
    """The Kineto summaries the report's time breakdown combines: the job's uploads outside live captures."""
    captured = {tid for c in session.scalars(select(Capture).where(Capture.job_pk == job.id))
                for tid in c.trace_ids or []}
    return [s for tid, s in _trace_summaries(session, job).items() if tid not in captured and s["kind"] == "kineto"]


def _capture_row(capture: Capture) -> CaptureRow:
    requested = to_epoch(capture.requested_at)
    assert requested is not None
    return CaptureRow(capture_id=capture.capture_id, kind=capture.kind, steps=capture.steps, ranks=capture.ranks,
                      state=capture.state, reason=capture.reason, trigger=capture.trigger or {},
                      requested_at_s=requested, analyzed_at_s=to_epoch(capture.analyzed_at),
                      trace_ids=list(capture.trace_ids or []))


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


def has_report(session: Session, job: Job) -> bool:
    """Whether the job has a cached report of this analyzer version (without reading the document)."""
    return session.scalar(select(Report.computed_at).where(
        Report.job_pk == job.id, Report.analyzer_version == characterize_mod.ANALYZER_VERSION)) is not None
