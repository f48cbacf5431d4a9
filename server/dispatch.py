"""Where background work runs: Celery on Redis (cluster mode) or an in-process thread (embedded mode).

Services call `dispatcher.characterize(job_pk)` and do not care which.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def characterize(self, job_pk: int) -> None: ...

    def close(self) -> None: ...


class CeleryDispatcher:
    def __init__(self, celery_app):
        self.celery_app = celery_app

    def characterize(self, job_pk: int) -> None:
        from server.tasks import CHARACTERIZE_TASK

        try:
            self.celery_app.send_task(CHARACTERIZE_TASK, args=[job_pk])
        except Exception:  # noqa: BLE001 - a broker outage must not fail ingest; beat catches up
            log.warning("broker unreachable: characterization of job %s deferred to the periodic sweep", job_pk)

    def close(self) -> None:
        pass


class InProcessDispatcher:
    """Embedded mode: one background thread runs tasks in submission order."""

    def __init__(self, sessionmaker, settings):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetprof-task")
        self._sessionmaker = sessionmaker
        self._settings = settings

    def characterize(self, job_pk: int) -> None:
        from server.jobs.report_service import characterize_job_pk

        def _run() -> None:
            try:
                characterize_job_pk(self._sessionmaker, job_pk, self._settings)
            except Exception:  # noqa: BLE001 - logged; the next trigger retries
                log.exception("characterization of job %s failed", job_pk)

        self._pool.submit(_run)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
