"""Ship framework events to the collector without ever blocking the training loop.

The training thread only appends plain dicts to a bounded deque (no lock, no validation, no I/O). A daemon
thread wakes up every `flush_interval_s` (or once a full batch is queued), validates the events against the
wire protocol in one call per batch, wraps them in an `EventBatch` and posts it. It posts at most one
partial batch per wake-up: a post costs the process about a millisecond of CPU (HTTP, JSON), and a sender
that chased a fast training loop's queue down to empty posted a handful of events at a time, burning more
CPU per step than the hooks on the training thread. A collector that is down costs the training loop
nothing: the batch is retried with exponential backoff while new events keep queueing, and when the queue
is full the oldest events are dropped and counted (logged at exit, never silent).
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from fleetprof.client import INGEST_EVENTS_PATH as EVENTS_PATH
from fleetprof.client import ApiError, Client
from fleetprof.protocol import PROTOCOL_VERSION, Event

log = logging.getLogger(__name__)

_EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)
_EVENTS_ADAPTER: TypeAdapter[list[Any]] = TypeAdapter(list[Event])


def new_source_id() -> str:
    """Unique per process (and per fork): host, pid and a random suffix."""
    return f"hooks:{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(4)}"


class EventSender:
    """Bounded event queue + background poster. `put()` is the only call made on the training thread."""

    def __init__(self, transport: Client, *, source_id: str | None = None, max_queue: int = 10_000,
                 batch_max: int = 500, flush_interval_s: float = 1.0, backoff_max_s: float = 30.0,
                 clock: Callable[[], float] = time.time):
        self._transport = transport
        self.source_id = source_id or new_source_id()
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._max_queue = max_queue
        self._batch_max = batch_max
        self._flush_interval_s = flush_interval_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._cond = threading.Condition()
        self._seq = 0
        self._closing = False
        self._thread: threading.Thread | None = None
        # A batch that failed with a retryable error is resent with the same seq (server de-duplicates).
        self._pending: tuple[int, list[dict[str, Any]]] | None = None
        self._side_jobs: collections.deque[Callable[[Client], None]] = collections.deque()
        self.dropped_total = 0
        self.invalid_total = 0
        self.sent_total = 0
        self._warned: set[str] = set()
        self._backoff_s = 0.0
        self._woken = False  # a wake-up for a full batch is on its way: put() need not notify again

    @property
    def transport(self) -> Client:
        """The client events go out through (the capture poller uses it too)."""
        return self._transport

    # ------------------------------------------------------------------ training-thread side

    def put(self, event: dict[str, Any]) -> None:
        # Lock-free: deque.append/popleft are atomic, and only this thread appends. The lock is taken only to
        # drop the oldest event of a full queue, to start the thread, and to wake it once per full batch.
        queue = self._queue
        if len(queue) >= self._max_queue:
            self._drop_oldest()
        queue.append(event)
        if self._thread is None:
            self._start_locked()
        elif len(queue) >= self._batch_max and not self._woken:
            self._wake()

    def _drop_oldest(self) -> None:
        with self._cond:
            while len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.dropped_total += 1

    def _start_locked(self) -> None:
        with self._cond:
            if self._thread is None:
                self._start()

    def _wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify()

    def submit(self, job: Callable[[Client], None]) -> None:
        """Run `job(transport)` once on the sender thread (e.g. an allocator-trace upload)."""
        with self._cond:
            self._side_jobs.append(job)
            if self._thread is None:
                self._start()
            self._cond.notify()

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued, waiting at most `timeout_s`; the thread is a daemon either way."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        if self.dropped_total or self._queue:
            log.warning("fleetprof hooks: %d events dropped (queue full), %d unsent at exit",
                        self.dropped_total, len(self._queue) + len(self._pending[1] if self._pending else ()))

    def forget_thread(self) -> None:
        """After fork: the child has no sender thread; start afresh (with a new source id) on next put."""
        self._thread = None
        self._cond = threading.Condition()
        self.source_id = new_source_id()
        self._queue.clear()
        self._pending = None
        self._woken = False

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetprof-events", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ sender-thread side

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _take_batch(self) -> tuple[int, list[dict[str, Any]]] | None:
        if self._pending is not None:
            return self._pending
        queue = self._queue
        with self._cond:  # put() drops the oldest under this lock too
            n = min(len(queue), self._batch_max)
            raw = [queue.popleft() for _ in range(n)]
        if not raw:
            return None
        try:  # the whole batch in one call to pydantic-core
            _EVENTS_ADAPTER.validate_python(raw)
        except ValidationError:
            events = self._valid_events(raw)
        else:
            # Valid as they are: the hooks build events of JSON types (the protocol's numbers are strict, so
            # validation converts nothing), sent as they are, with unknown (None) fields left out as the model's
            # dump would leave them out.
            events = [ev if None not in ev.values() else {k: v for k, v in ev.items() if v is not None}
                      for ev in raw]
        if not events:
            return None
        self._pending = (self._seq, events)
        self._seq += 1
        return self._pending

    def _valid_events(self, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A batch that failed validation: keep its valid events, drop (and count) the others."""
        events = []
        for ev in raw:
            try:
                events.append(_EVENT_ADAPTER.dump_python(_EVENT_ADAPTER.validate_python(ev), mode="json",
                                                         exclude_none=True))
            except ValidationError as exc:
                self.invalid_total += 1
                self._warn_once("invalid", "fleetprof hooks: dropping invalid %s event: %s", ev.get("kind"), exc)
        return events

    def _post(self, seq: int, events: list[dict[str, Any]]) -> None:
        body = {"protocol_version": PROTOCOL_VERSION, "source_id": self.source_id, "seq": seq,
                "sent_at": self._clock(), "events": events}
        self._transport.post_json(EVENTS_PATH, body)

    def _run(self) -> None:
        backoff_s = 0.0
        self._backoff_s = 0.0
        while True:
            with self._cond:
                if backoff_s:  # a full queue's wake-up does not cut a backoff short; closing or an upload does
                    deadline = time.monotonic() + backoff_s
                    while not self._closing and not self._side_jobs:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                elif not self._closing and not self._woken:
                    self._cond.wait(self._flush_interval_s)
                self._woken = False
                closing = self._closing
            while self._side_jobs:
                job = self._side_jobs.popleft()
                try:
                    job(self._transport)
                except Exception as exc:  # an upload must never take the sender down
                    self._warn_once("side", "fleetprof hooks: upload failed: %s", exc)
            try:
                backoff_s = self._drain(closing)
            except Exception as exc:  # defensive: the thread must survive anything
                self._warn_once("drain", "fleetprof hooks: event sender error: %r", exc)
                self._pending = None
                backoff_s = self._flush_interval_s
            if closing:
                return

    def _drain(self, closing: bool) -> float:
        """Send what is queued: every full batch, then at most one partial batch (all of it when closing).
        Return the backoff to wait before the next try (0 when done)."""
        while True:
            batch = self._take_batch()
            if batch is None:
                self._backoff_s = 0.0
                return 0.0
            seq, events = batch
            try:
                self._post(seq, events)
            except ApiError as exc:
                if not exc.retryable:
                    self._warn_once(f"final{exc.status}", "fleetprof hooks: collector refused events: %s", exc)
                    self._pending = None
                    continue
                self._warn_once("retry", "fleetprof hooks: collector unreachable, will retry: %s", exc)
                if closing:
                    return 0.0
                self._backoff_s = min(self._backoff_max_s,
                                      max(self._backoff_s * 2, 0.5, exc.retry_after_s or 0.0))
                return self._backoff_s
            self.sent_total += len(events)
            self._pending = None
            self._backoff_s = 0.0
            if not closing and len(self._queue) < self._batch_max:
                return 0.0  # the rest waits for the next interval (or a full batch)
