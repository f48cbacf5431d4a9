"""The periodic sweep's choice of the jobs whose report needs computing (again)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.analysis import characterize as characterize_mod
from server.jobs.report_store import LATE_DATA_WINDOW
from server.models import Job, Report
from server.models.base import utcnow


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
