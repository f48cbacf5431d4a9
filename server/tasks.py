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


@shared_task(name=CHARACTERIZE_TASK, acks_late=True, autoretry_for=(Exception,), max_retries=3,
             retry_backoff=True, retry_backoff_max=60)
def characterize_job(job_pk: int) -> bool:
    from server.jobs.report_service import characterize_job_pk
    from server.worker import session_factory

    with TASK_LATENCY.labels(task="characterize").time():
        return characterize_job_pk(session_factory(), job_pk, get_settings())


@shared_task(name="fleetprof.characterize_due", acks_late=True)
def characterize_due() -> int:
    """Beat: re-characterize running jobs periodically, and ended jobs once their late-data window closed."""
    from server.jobs.report_service import jobs_due
    from server.worker import session_factory

    with session_scope(session_factory()) as session:
        due = jobs_due(session, every_s=get_settings().characterize_running_every_s)
    for job_pk in due:
        characterize_job.delay(job_pk)
    return len(due)


@shared_task(name="fleetprof.rollup_recent", acks_late=True, autoretry_for=(Exception,), max_retries=3)
def rollup_recent(hours: int = 2) -> int:
    from server.fleet.service import rollup_hours
    from server.worker import session_factory

    now = time.time()
    with session_scope(session_factory()) as session:
        return rollup_hours(session, since=now - hours * 3600, until=now)


@shared_task(name="fleetprof.storage_maintenance", acks_late=True, autoretry_for=(Exception,), max_retries=3)
def storage_maintenance() -> int:
    """Beat: create the next days' partitions, drop raw-sample days past the retention (rollups kept)."""
    from server.storage.partitions import apply_retention, precreate
    from server.worker import session_factory

    factory = session_factory()
    now = time.time()
    with session_scope(factory) as session:
        precreate(session.get_bind(), now=now)
        return len(apply_retention(session, now=now, raw_retention_days=get_settings().raw_retention_days))
