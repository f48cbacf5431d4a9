"""The jobs domain's Celery tasks: characterize one job, and the beat's sweep that queues the jobs due.

Thin, idempotent, named; the computation lives in server.analysis (pure) via report_store."""

from __future__ import annotations

import logging

from celery import shared_task

from server.config import get_settings
from server.db import session_scope
from server.jobs.report_store import characterize_job_pk
from server.jobs.sweep import jobs_due
from server.jobs.unseen import end_unseen_jobs
from server.metrics import TASK_LATENCY
from server.worker_session import session_factory

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
    try:
        with TASK_LATENCY.labels(task="characterize").time():
            return characterize_job_pk(session_factory(), job_pk, get_settings())
    finally:
        _pending(job_pk).release()


@shared_task(name="fleetprof.characterize_due", acks_late=True)
def characterize_due() -> int:
    """Beat: end the jobs the agents no longer see, re-characterize running jobs periodically, and ended jobs once
    their late-data window closed (a job ended now is among them: its final report)."""
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
