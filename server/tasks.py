"""Celery tasks: thin, idempotent, named. The computation lives in server.analysis (pure) via report_service."""

from __future__ import annotations

import logging
import time

from celery import shared_task

from server.config import get_settings
from server.db import session_scope
from server.metrics import TASK_LATENCY

log = logging.getLogger(__name__)

CHARACTERIZE_TASK = "fleetprof.characterize_job"
PENDING_TTL_S = 900  # a claim outlives a lost task by this much at most


class _Pending:
    """A per-job 'characterization queued' marker in Redis (SET NX EX), released when the task ends."""

    def __init__(self, job_pk: int):
        settings = get_settings()
        self.key = f"{settings.queue_name}:characterize-pending:{job_pk}"
        self.url = settings.broker_url

    def _redis(self):
        import redis

        if not self.url:
            raise RuntimeError("no broker URL configured: the pending-characterization marker lives in Redis")
        return redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)

    def claim(self) -> bool:
        return bool(self._redis().set(self.key, "1", nx=True, ex=PENDING_TTL_S))

    def release(self) -> None:
        try:
            self._redis().delete(self.key)
        except Exception:  # noqa: BLE001 - the TTL frees it anyway
            log.warning("could not release %s", self.key)


def _pending(job_pk: int) -> _Pending:
    return _Pending(job_pk)


@shared_task(name=CHARACTERIZE_TASK, acks_late=True, autoretry_for=(Exception,), max_retries=3,
             retry_backoff=True, retry_backoff_max=60)
def characterize_job(job_pk: int) -> bool:
    from server.jobs.report_service import characterize_job_pk
    from server.worker import session_factory

    try:
        with TASK_LATENCY.labels(task="characterize").time():
            return characterize_job_pk(session_factory(), job_pk, get_settings())
    finally:
        _pending(job_pk).release()


@shared_task(name="fleetprof.characterize_due", acks_late=True)
def characterize_due() -> int:
    """Beat: end the jobs the agents no longer see, re-characterize running jobs periodically, and ended jobs once
    their late-data window closed (a job ended now is among them: its final report)."""
    from server.jobs.report_service import jobs_due
    from server.jobs.unseen import end_unseen_jobs
    from server.worker import session_factory

    settings = get_settings()
    with session_scope(session_factory()) as session:
        end_unseen_jobs(session, timeout_s=settings.job_unseen_timeout_s)
    with session_scope(session_factory()) as session:
        due = jobs_due(session, every_s=settings.characterize_running_every_s)
    queued = 0
    for job_pk in due:
        # One queued characterization per job: a slow job must not pile up a copy per sweep.
        if _pending(job_pk).claim():
            characterize_job.delay(job_pk)
            queued += 1
    return queued


ROLLUP_RANGE_TASK = "fleetprof.rollup_range"


@shared_task(name="fleetprof.rollup_recent", acks_late=True, autoretry_for=(Exception,), max_retries=3)
def rollup_recent(hours: int | None = None) -> int:
    """Beat: the last `hours` hours of rollups (default RECENT_HOURS), fanned out as one rollup_range task per GPU
    range so that the workers share the sweep (at 1 Hz one range's 3 hours are ~2 M raw rows, ~5 s; 10,000 GPUs in
    one task would take longer than the 5-minute beat interval), and one per run of backlog hours (samples that
    arrived after the sweep had passed their hour). Returns the tasks queued."""
    from server.fleet.service import RECENT_HOURS, backlog_spans, rollup_ranges
    from server.worker import session_factory

    now = time.time()
    with session_scope(session_factory()) as session:
        ranges = rollup_ranges(session)
        backlog = backlog_spans(session, now=now, raw_retention_days=get_settings().raw_retention_days)
    for k in ranges:
        rollup_range.delay(k, now - (RECENT_HOURS if hours is None else hours) * 3600, now, now)
    for k, first, last in backlog:
        rollup_range.delay(k, first, last, now)
    return len(ranges) + len(backlog)


@shared_task(name=ROLLUP_RANGE_TASK, acks_late=True, autoretry_for=(Exception,), max_retries=3,
             retry_backoff=True, retry_backoff_max=60)
def rollup_range(k: int, since: float, until: float, now: float) -> int:
    """The rollups of GPU range `k` (server.fleet.service.rollup_ranges) for the hours in [since, until]."""
    from server.fleet.service import rollup_hours
    from server.worker import session_factory

    with TASK_LATENCY.labels(task="rollup").time(), session_scope(session_factory()) as session:
        return rollup_hours(session, since=since, until=until, now=now, ranges=[k])


@shared_task(name="fleetprof.storage_maintenance", acks_late=True, autoretry_for=(Exception,), max_retries=3)
def storage_maintenance() -> int:
    """Beat: create the next days' partitions, drop raw-sample days past the retention (rollups kept)."""
    from server.storage.partitions import apply_retention, precreate
    from server.worker import session_factory

    factory = session_factory()
    now = time.time()
    with session_scope(factory) as session:
        precreate(session, now=now)
        return len(apply_retention(session, now=now, raw_retention_days=get_settings().raw_retention_days))
