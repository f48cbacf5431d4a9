"""Where background work runs: Celery on Redis (cluster mode) or an in-process thread (embedded mode).

Services call `dispatcher.characterize(job_pk)` and do not care which. The dispatcher sits below the domains: it is
given the task's name (Celery) or its body (in-process) by the app that builds it, and imports no domain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def characterize(self, job_pk: int) -> None: ...

    def close(self) -> None: ...


class CeleryDispatcher:
    """Cluster mode: the task is sent by name (`characterize_task`, server.jobs.tasks.CHARACTERIZE_TASK)."""

    def __init__(self, celery_app, *, characterize_task: str):
        self.celery_app = celery_app
        self.characterize_task = characterize_task

    def characterize(self, job_pk: int) -> None:
        try:
            self.celery_app.send_task(self.characterize_task, args=[job_pk])
        except Exception:  # noqa: BLE001 - a broker outage must not fail ingest; beat catches up
            log.warning("broker unreachable: characterization of job %s deferred to the periodic sweep", job_pk)

    def close(self) -> None:
        pass


class InProcessDispatcher:
    """Embedded mode: one background thread runs tasks in submission order; `characterize(job_pk)` is the task body
    (server.jobs.report_store.characterize_job_pk with its sessionmaker and settings bound)."""

    def __init__(self, *, characterize: Callable[[int], object]):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetprof-task")
        self._characterize = characterize

    def characterize(self, job_pk: int) -> None:
        def _run() -> None:
            try:
                self._characterize(job_pk)
            except Exception:  # noqa: BLE001 - logged; the next trigger retries
                log.exception("characterization of job %s failed", job_pk)

        self._pool.submit(_run)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
