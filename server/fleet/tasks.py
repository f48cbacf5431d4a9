"""The fleet domain's Celery tasks: the beat's hourly-rollup sweep, fanned out as one task per GPU range."""

from __future__ import annotations

import time

from celery import shared_task

from server.config import get_settings
from server.db import session_scope
from server.fleet.service import RECENT_HOURS, backlog_spans, rollup_hours, rollup_ranges
from server.metrics import TASK_LATENCY
from server.worker_session import session_factory

ROLLUP_RANGE_TASK = "fleetprof.rollup_range"


@shared_task(name="fleetprof.rollup_recent", acks_late=True, autoretry_for=(Exception,), max_retries=3)
def rollup_recent(hours: int | None = None) -> int:
    """Beat: the last `hours` hours of rollups (default RECENT_HOURS), fanned out as one rollup_range task per GPU
    range so that the workers share the sweep (at 1 Hz one range's 3 hours are ~2 M raw rows, ~5 s; 10,000 GPUs in
    one task would take longer than the 5-minute beat interval), and one per run of backlog hours (samples that
    arrived after the sweep had passed their hour). Returns the tasks queued."""
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
    with TASK_LATENCY.labels(task="rollup").time(), session_scope(session_factory()) as session:
        return rollup_hours(session, since=since, until=until, now=now, ranges=[k])
