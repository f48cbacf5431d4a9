"""Daily range partitions of the raw sample tables (Postgres), and retention by dropping whole days.

`gpu_samples` and `process_samples` are `PARTITION BY RANGE (ts)` with one partition per UTC day, named
`<table>_pYYYYMMDD`. Ingest makes sure the days it writes exist (cached per process, created in autocommit so
no lock is held by the ingest transaction); retention drops the partitions wholly older than the cut-off, which
costs no vacuum and no index bloat, unlike DELETE. Hourly rollups (`gpu_hourly`) are not partitioned and are
kept. SQLite (embedded mode) has no partitions: retention there is a DELETE.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from server.db import rowcount
from server.models import GpuSample, ProcessSample

log = logging.getLogger(__name__)

PARTITIONED_TABLES = ("gpu_samples", "process_samples")
DAY_S = 86_400
LOCK_TIMEOUT_MS = 5000
PRECREATE_DAYS = 2  # the periodic sweep creates today and the next days, so ingest rarely has to
_NAME = re.compile(r"^(?P<table>[a-z_]+)_p(?P<day>\d{8})$")


def day_of(ts: float) -> int:
    """UTC day number (days since epoch) of a timestamp."""
    return int(ts // DAY_S)


def partition_name(table: str, day: int) -> str:
    return f"{table}_p{datetime.fromtimestamp(day * DAY_S, UTC):%Y%m%d}"


def _bounds(day: int) -> tuple[str, str]:
    lo = datetime.fromtimestamp(day * DAY_S, UTC)
    return lo.isoformat(), (lo + timedelta(days=1)).isoformat()


class PartitionManager:
    """Creates missing daily partitions; remembers what exists so the hot path asks nothing."""

    def __init__(self) -> None:
        self._known: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def ensure(self, session: Session, days: Iterable[int], tables: Iterable[str] = PARTITIONED_TABLES) -> int:
        """Create the missing days in the caller's transaction.

        In the caller's transaction, not on a connection of its own: a transaction that already wrote to the
        table would otherwise wait on itself. CREATE ... PARTITION OF locks the parent until the caller commits
        (one short group, once per day and table); `lock_timeout` keeps it from queueing behind a long reader
        and stalling every writer behind it: past it the insert fails and the batch is answered 503 and resent.
        """
        if session.get_bind().dialect.name != "postgresql":
            return 0
        with self._lock:
            wanted = sorted({(t, d) for t in tables for d in days} - self._known)
        if not wanted:
            return 0
        created = 0
        session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"))
        for table, day in wanted:
            lo, hi = _bounds(day)
            savepoint = session.begin_nested()
            try:
                session.execute(text(f"CREATE TABLE IF NOT EXISTS {partition_name(table, day)} PARTITION OF {table} "
                                     f"FOR VALUES FROM ('{lo}') TO ('{hi}')"))
                savepoint.commit()
                created += 1
            except DBAPIError as exc:
                savepoint.rollback()
                # Another collector created it between our check and our CREATE: that is fine.
                if "already exists" not in str(exc.orig):
                    raise
            with self._lock:
                # If the caller's transaction rolls back, so does the partition: whoever then fails to insert
                # calls forget() and the next attempt creates it again.
                self._known.add((table, day))
        session.execute(text("SET LOCAL lock_timeout = DEFAULT"))
        if created:
            log.info("created %d daily partition(s)", created)
        return created

    def forget(self) -> None:
        with self._lock:
            self._known.clear()


# One per process: what this process knows exists. Retention (and any failed insert) clears it.
PARTITIONS = PartitionManager()


def precreate(session: Session, *, now: float, days_ahead: int = PRECREATE_DAYS) -> int:
    today = day_of(now)
    return PARTITIONS.ensure(session, range(today, today + days_ahead + 1))


def list_partitions(session: Session, table: str) -> list[tuple[str, int]]:
    rows = session.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t ORDER BY c.relname"), {"t": table}).scalars()
    out = []
    for name in rows:
        m = _NAME.match(name)
        if m:
            day = datetime.strptime(m.group("day"), "%Y%m%d").replace(tzinfo=UTC).timestamp() // DAY_S
            out.append((name, int(day)))
    return out


def apply_retention(session: Session, *, now: float, raw_retention_days: int) -> list[str]:
    """Drop raw-sample days wholly older than the retention; returns what was dropped (or deleted)."""
    cutoff_day = day_of(now) - raw_retention_days
    if session.get_bind().dialect.name != "postgresql":
        cutoff = datetime.fromtimestamp(cutoff_day * DAY_S, UTC)
        n = rowcount(session.execute(delete(GpuSample).where(GpuSample.ts < cutoff)))
        n += rowcount(session.execute(delete(ProcessSample).where(ProcessSample.ts < cutoff)))
        return [f"{n} rows before {cutoff:%Y-%m-%d}"] if n else []
    dropped = []
    for table in PARTITIONED_TABLES:
        for name, day in list_partitions(session, table):
            if day >= cutoff_day:
                continue
            # Dropping a partition locks its parent: give up quickly when readers hold it (next sweep retries)
            # rather than queue and stall ingest behind us.
            savepoint = session.begin_nested()
            try:
                session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"))
                session.execute(text(f"DROP TABLE IF EXISTS {name}"))
                savepoint.commit()
                dropped.append(name)
            except DBAPIError as exc:
                savepoint.rollback()
                log.warning("retention: %s not dropped now (%s); the next sweep retries", name,
                            str(exc.orig).strip().splitlines()[0])
    if dropped:
        PARTITIONS.forget()
        log.info("retention: dropped %s", ", ".join(dropped))
    return dropped
