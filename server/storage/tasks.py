"""Storage's Celery task: the beat's partition upkeep (next days created, raw-sample days past retention dropped)."""

from __future__ import annotations

import time

from celery import shared_task

from server.config import get_settings
from server.db import session_scope
from server.storage.partitions import apply_retention, precreate
from server.worker_session import session_factory


@shared_task(name="fleetprof.storage_maintenance", acks_late=True, autoretry_for=(Exception,), max_retries=3)
def storage_maintenance() -> int:
    """Beat: create the next days' partitions, drop raw-sample days past the retention (rollups kept)."""
    factory = session_factory()
    now = time.time()
    with session_scope(factory) as session:
        precreate(session, now=now)
        return len(apply_retention(session, now=now, raw_retention_days=get_settings().raw_retention_days))
