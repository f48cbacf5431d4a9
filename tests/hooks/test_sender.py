"""EventSender: batching, seq, retry with the same seq, drop-oldest when full, bounded close."""

from __future__ import annotations

import threading
import time
from typing import Any

from agent.hooks.sender import EVENTS_PATH, EventSender
from fleetprof.client import ApiError


class FakeTransport:
    def __init__(self, fail_times: int = 0, status: int | None = None):
        self.posts: list[dict[str, Any]] = []
        self.fail_times = fail_times
        self.status = status
        self.attempts = 0
        self.posted = threading.Event()

    def post_json(self, path: str, payload: Any) -> None:
        assert path == EVENTS_PATH
        self.attempts += 1
        if self.attempts <= self.fail_times:
            raise ApiError(self.status, "down", retry_after_s=0.0)
        self.posts.append(payload)
        self.posted.set()


def _step(i: int) -> dict[str, Any]:
    return {"kind": "step", "job_id": "j", "ts": time.time(), "step": i, "wall_s": 0.1}


def test_batches_in_order_with_increasing_seq() -> None:
    tr = FakeTransport()
    s = EventSender(tr, batch_max=3, flush_interval_s=0.05)  # type: ignore[arg-type]
    for i in range(7):
        s.put(_step(i))
    s.close(timeout_s=5)
    assert [p["seq"] for p in tr.posts] == list(range(len(tr.posts)))
    assert [e["step"] for p in tr.posts for e in p["events"]] == list(range(7))
    assert all(len(p["events"]) <= 3 and p["source_id"] == s.source_id for p in tr.posts)


def test_retryable_error_resends_same_seq() -> None:
    tr = FakeTransport(fail_times=2, status=503)
    s = EventSender(tr, flush_interval_s=0.01, backoff_max_s=0.05)  # type: ignore[arg-type]
    s.put(_step(0))
    assert tr.posted.wait(10)
    s.close(timeout_s=5)
    assert tr.attempts == 3 and [p["seq"] for p in tr.posts] == [0]


def test_final_error_drops_batch_and_goes_on() -> None:
    tr = FakeTransport(fail_times=1, status=422)
    s = EventSender(tr, flush_interval_s=0.01)  # type: ignore[arg-type]
    s.put(_step(0))
    time.sleep(0.2)
    s.put(_step(1))
    s.close(timeout_s=5)
    assert [e["step"] for p in tr.posts for e in p["events"]] == [1]


def test_full_queue_drops_oldest_and_counts_and_invalid_events_are_dropped() -> None:
    tr = FakeTransport()
    s = EventSender(tr, max_queue=5, flush_interval_s=60)  # type: ignore[arg-type]
    s.put({"kind": "step", "job_id": "j", "ts": time.time(), "step": 0, "wall_s": float("nan")})
    for i in range(1, 9):
        s.put(_step(i))
    assert s.dropped_total == 4
    s.close(timeout_s=5)
    assert [e["step"] for p in tr.posts for e in p["events"]] == [4, 5, 6, 7, 8]


def test_close_is_bounded_when_collector_hangs() -> None:
    class Hanging(FakeTransport):
        def post_json(self, path: str, payload: Any) -> None:
            time.sleep(30)

    s = EventSender(Hanging(), flush_interval_s=0.01)  # type: ignore[arg-type]
    s.put(_step(0))
    time.sleep(0.1)
    t0 = time.perf_counter()
    s.close(timeout_s=0.3)
    assert time.perf_counter() - t0 < 1.0


def test_posts_full_batches_then_one_partial_batch_not_a_post_per_event() -> None:
    """A fast producer must not get a post every few events (each costs the training process CPU)."""
    tr = FakeTransport()
    s = EventSender(tr, batch_max=10, flush_interval_s=60)  # type: ignore[arg-type]
    for i in range(25):
        s.put(_step(i))
    deadline = time.monotonic() + 5
    while len(tr.posts) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert [len(p["events"]) for p in tr.posts] == [10, 10]  # the 5 left wait for the interval (or close)
    s.close(timeout_s=5)
    assert [len(p["events"]) for p in tr.posts] == [10, 10, 5]
    assert [e["step"] for p in tr.posts for e in p["events"]] == list(range(25))


def test_valid_batch_is_sent_as_built_without_unknown_fields() -> None:
    tr = FakeTransport()
    s = EventSender(tr, flush_interval_s=60)  # type: ignore[arg-type]
    ev = {**_step(0), "samples": None, "device_s": 0.25}
    s.put(ev)
    s.close(timeout_s=5)
    (sent,) = tr.posts[0]["events"]
    assert sent == {k: v for k, v in ev.items() if v is not None}
