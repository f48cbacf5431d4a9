"""Automatic captures: the server watches each running job's step times as the hooks' step events arrive and, on a
regression (server.analysis.time.step_regression), requests a kineto capture itself, at most one per job per
`capture_min_interval_s`. Where the job's report knows a straggler rank (time.stragglers, from the hooks), the
capture goes to that rank and one healthy peer.

Run inside the events' ingest transaction (once per step-event batch of a job, the hooks send about one a second
per rank), so it must be cheap: one indexed look-up of the job's latest automatic capture (after a capture, calls
stop there for the interval), then two reads of at most `recent` and `baseline` steps of one rank by the (job, rank,
step) primary key: a healthy job pays those three small reads per batch. The report is read only when a capture
fires.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetprof.api_models import CaptureCreate
from server.analysis.time.step_regression import StepRegression, step_regression
from server.captures import service as capture_service
from server.config import ServerSettings
from server.jobs import report_store
from server.models import TERMINAL_STATES, Capture, Job, JobStep
from server.models.base import utcnow

log = logging.getLogger(__name__)

MANUAL = "manual"


def _steps(session: Session, job: Job, rank: int, *, newest: bool, offset: int, limit: int) -> list[tuple[int, float]]:
    order = JobStep.step.desc() if newest else JobStep.step.asc()
    rows = session.execute(select(JobStep.step, JobStep.wall_s)
                           .where(JobStep.job_pk == job.id, JobStep.rank == rank)
                           .order_by(order).offset(offset).limit(limit)).tuples().all()
    return [(int(s), float(w)) for s, w in rows]


def _recent_automatic(session: Session, job: Job, settings: ServerSettings) -> bool:
    since = utcnow() - timedelta(seconds=settings.capture_min_interval_s)
    return session.scalar(select(Capture.id).where(Capture.job_pk == job.id, Capture.trigger_kind != MANUAL,
                                                   Capture.requested_at >= since).limit(1)) is not None


def _straggler_ranks(session: Session, job: Job) -> tuple[int, int] | None:
    """(slowest straggler rank, a healthy peer) from the job's latest report, where its hooks found one."""
    row = report_store.cached_report(session, job)
    section: Any = ((row.data if row is not None else None) or {}).get("time") or {}
    stragglers = section.get("stragglers") or {}
    found = [s for s in stragglers.get("stragglers") or [] if isinstance(s.get("rank"), int)]
    world = stragglers.get("ranks")
    if not found or not isinstance(world, int):
        return None
    slow = max(found, key=lambda s: s.get("slowdown_fraction") or 0.0)["rank"]
    healthy = next((r for r in range(world) if r not in {s["rank"] for s in found}), None)
    return None if healthy is None else (slow, healthy)


def check_job(session: Session, *, job: Job, rank: int, settings: ServerSettings) -> Capture | None:
    """The automatic capture requested now for `job` (whose `rank` just sent steps), or None."""
    if not settings.capture_auto or job.state in TERMINAL_STATES or _recent_automatic(session, job, settings):
        return None
    recent = _steps(session, job, rank, newest=True, offset=0, limit=settings.capture_recent_steps)
    needed = settings.capture_warmup_steps + settings.capture_baseline_steps + settings.capture_recent_steps
    if len(recent) < settings.capture_recent_steps or recent[0][0] + 1 < needed:
        return None
    baseline = _steps(session, job, rank, newest=False, offset=settings.capture_warmup_steps,
                      limit=settings.capture_baseline_steps)
    if len(baseline) < settings.capture_baseline_steps:
        return None
    found = step_regression(baseline, recent, min_factor=settings.capture_slowdown_factor)
    if found is None:
        return None
    # Two collectors may ingest this job's steps at once: the job's row lock orders them, the second sees the first's.
    session.execute(select(Job.id).where(Job.id == job.id).with_for_update())
    if _recent_automatic(session, job, settings):
        return None
    return _request(session, job, rank, found, settings)


def _request(session: Session, job: Job, rank: int, found: StepRegression, settings: ServerSettings) -> Capture:
    evidence = dict(baseline_median_step_s=found.baseline_median_step_s,
                    recent_median_step_s=found.recent_median_step_s, factor=round(found.factor, 4),
                    baseline_steps=list(found.baseline_steps), recent_steps=list(found.recent_steps), rank=rank)
    slowdown = (f"median step time of rank {rank} rose {found.factor:.2f}x: {found.recent_median_step_s:.4g} s over "
                f"steps {found.recent_steps[0]}-{found.recent_steps[1]} vs {found.baseline_median_step_s:.4g} s over "
                f"steps {found.baseline_steps[0]}-{found.baseline_steps[1]}")
    pair = _straggler_ranks(session, job)
    if pair is not None:
        slow, healthy = pair
        trigger = capture_service.trigger_of("straggler", f"rank {slow} straggles ({slowdown}); capturing it and "
                                             f"healthy rank {healthy}", straggler_rank=slow, healthy_rank=healthy,
                                             **evidence)
        ranks: list[int] | None = [slow, healthy]
    else:
        trigger = capture_service.trigger_of("step_time_regression", slowdown, **evidence)
        ranks = None
    capture = capture_service.request_capture(
        session, job=job, data=CaptureCreate(kind="kineto", steps=settings.capture_auto_steps, ranks=ranks),
        trigger=trigger, requested_by=None)
    log.info("job %s: automatic capture %s (%s)", job.job_id, capture.capture_id, trigger.summary)
    return capture
