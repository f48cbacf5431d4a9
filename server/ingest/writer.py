"""Group commit for sample ingest: concurrent requests share one transaction and one bulk insert.

A request thread hands its prepared batch to the writer and waits; the writer drains whatever is queued (up to
`max_rows`), writes it in one transaction, commits, and then wakes every waiter. A request is thus still answered
only after its data is committed, but a commit (and its WAL flush) is paid once per group, not per request.
If a group fails, its batches are retried one by one so that one bad batch cannot fail the others.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from sqlalchemy.orm import Session, sessionmaker

from server.db import session_scope
from server.errors import is_database_unavailable
from server.ingest.service import IngestResult, PreparedSamples, write_samples
from server.storage.partitions import PARTITIONS

log = logging.getLogger(__name__)


class SampleWriter:
    def __init__(self, factory: sessionmaker[Session], *, max_rows: int = 50_000, writers: int = 2):
        self._factory = factory
        self._max_rows = max_rows
        self._queue: queue.Queue[tuple[PreparedSamples, Future[IngestResult]] | None] = queue.Queue()
        # Several writers, each with its own connection, so Postgres inserts on several cores while the next
        # groups form. Two groups racing on the same (gpu, ts) key wait on each other (ON CONFLICT); a deadlock
        # there fails the group, which is then retried batch by batch.
        self._threads = [threading.Thread(target=self._run, name=f"fleetprof-sample-writer-{i}", daemon=True)
                         for i in range(writers)]
        for t in self._threads:
            t.start()

    def submit(self, item: PreparedSamples) -> Future[IngestResult]:
        future: Future[IngestResult] = Future()
        self._queue.put((item, future))
        return future

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)

    def _drain(self, first: tuple[PreparedSamples, Future[IngestResult]]) -> tuple[list, bool]:
        group = [first]
        rows = len(first[0].batch.samples)
        while rows < self._max_rows:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                return group, True
            group.append(nxt)
            rows += len(nxt[0].batch.samples)
        return group, False

    def _write(self, group: list[tuple[PreparedSamples, Future[IngestResult]]], *, retry: bool = True) -> None:
        try:
            with session_scope(self._factory) as session:
                results = write_samples(session, [item for item, _ in group])
        except Exception as exc:  # noqa: BLE001 - isolate the failing batch below
            PARTITIONS.forget()  # a day dropped by retention elsewhere is recreated on the retry
            if not retry or is_database_unavailable(exc):
                # A database that is down fails every batch alike: answer them all (503) at once.
                for _, future in group:
                    future.set_exception(exc)
                return
            log.warning("group of %d batches failed (%s); retrying one by one", len(group), exc)
            for one in group:
                self._write([one], retry=False)
            return
        for (_, future), result in zip(group, results, strict=True):
            future.set_result(result)

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            group, stop = self._drain(first)
            self._write(group)
