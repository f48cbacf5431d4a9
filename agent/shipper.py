"""Ships spooled batches to the collector, oldest first, until each one is acknowledged.

At-least-once: a batch leaves the spool only after a 200 from the collector (which answers after its
commit); a lost acknowledgement means a resend, which the collector recognises by (agent_id, seq).

Retry policy: network errors, 408, 429 and 5xx back off exponentially with jitter (half fixed, half random,
so a fleet of agents coming back after a collector outage does not stampede it), and a `Retry-After` on
429/503 is honoured as given. 401/403/404 are configuration problems, not bad data: keep the batch and
retry at the slowest pace. 400/413/422 mean the collector will never take this batch: it is dropped and its
samples counted in `dropped_samples_total` so the loss is reported, never silent.

Clock skew (agent clock minus server clock) is measured around each acknowledged request from the ack's
`server_time` (or the `Date` header, 1-s resolution) and reported by later batches.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from agent.spool import Spool
from fleetprof.client import INGEST_SAMPLES_PATH, ApiError, Client, retry_delay_s

log = logging.getLogger(__name__)

_DISCARD_STATUSES = frozenset({400, 413, 422})


class Shipper:
    def __init__(self, spool: Spool, transport: Client, *, path: str = INGEST_SAMPLES_PATH,
                 clock: Callable[[], float] = time.time, rng: Callable[[], float] = random.random,
                 backoff_base_s: float = 0.5, backoff_max_s: float = 60.0, idle_wait_s: float = 1.0):
        self.spool = spool
        self.transport = transport
        self.path = path
        self.clock = clock
        self.rng = rng
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.idle_wait_s = idle_wait_s
        self.clock_skew_s: float | None = None
        self.sent_batches = 0
        self.duplicate_batches = 0
        self.failures = 0
        self._attempt = 0
        self._wake = threading.Event()

    def notify(self) -> None:
        """Something was spooled: stop idling."""
        self._wake.set()

    def ship_once(self) -> float | None:
        """Send the oldest batch. Returns None when it was acknowledged (or the spool is empty and there is
        nothing to wait for), else the seconds to wait before the next attempt."""
        item = self.spool.peek()
        if item is None:
            return None
        record, body = item
        t0 = self.clock()
        try:
            resp = self.transport.request("POST", self.path, raw_body=body)
        except ApiError as exc:
            self.failures += 1
            if exc.status in _DISCARD_STATUSES:
                self.spool.discard(record, str(exc))
                self._attempt = 0
                return None
            self._attempt += 1
            if exc.retryable:
                delay = retry_delay_s(exc, self._attempt, base_s=self.backoff_base_s, max_s=self.backoff_max_s,
                                      rng=self.rng)
                log.log(logging.WARNING if self._attempt == 1 else logging.DEBUG,
                        "collector unavailable (%s); retrying in %.1f s", exc, delay)
            else:  # 401/403/404...: keep the data, try again slowly
                delay = self.backoff_max_s
                log.error("collector refused the batch (%s); keeping it and retrying in %.0f s", exc, delay)
            return delay
        t1 = self.clock()
        body_json = resp.body if isinstance(resp.body, dict) else {}
        server_time = body_json.get("server_time")
        if isinstance(server_time, (int, float)) and server_time > 0:
            self.clock_skew_s = (t0 + t1) / 2 - float(server_time)
        elif resp.server_date_epoch_s is not None:
            # Date has whole seconds: on average half a second behind
            self.clock_skew_s = (t0 + t1) / 2 - (resp.server_date_epoch_s + 0.5)
        if body_json.get("duplicate"):
            self.duplicate_batches += 1
        if self._attempt:
            log.info("collector reachable again after %d failed attempts", self._attempt)
        self._attempt = 0
        self.spool.ack(record)
        self.sent_batches += 1
        return None

    def run(self, stop: threading.Event) -> None:
        """Ship until `stop` is set (then return promptly; what is left stays spooled for the next start)."""
        while not stop.is_set():
            try:
                delay = self.ship_once()
            except Exception:  # never let the shipper thread die: the spool keeps the data
                log.exception("shipper error")
                delay = self.backoff_max_s
            if delay is not None:
                stop.wait(delay)
            elif len(self.spool) == 0:
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()

    def flush(self, timeout_s: float) -> bool:
        """Try to empty the spool within timeout_s (on shutdown). True if everything was acknowledged."""
        deadline = time.monotonic() + timeout_s
        while len(self.spool) and time.monotonic() < deadline:
            if self.ship_once() is not None:
                return False
        return len(self.spool) == 0
