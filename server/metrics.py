"""The service's own Prometheus metrics (a private registry: tests build many apps in one process).

Process model: these counters live in the process that serves /metrics. `fleetprof server` runs one uvicorn
process by default, and that is what the exposition assumes; with `--workers N` each scrape reaches one worker
only, so run one collector per process behind the load balancer and scrape each (the usual Prometheus way),
rather than prometheus_client's multiprocess mode. What Celery workers do is not in this process at all: the
broker collector below reads the queue depth and the workers' task durations from Redis at scrape time.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

INGEST_SAMPLES = Counter("fleetprof_ingest_samples_total", "GPU samples stored", registry=REGISTRY)
INGEST_BATCHES = Counter("fleetprof_ingest_batches_total", "Ingest batches acknowledged", ["kind", "duplicate"],
                         registry=REGISTRY)
INGEST_REJECTED = Counter("fleetprof_ingest_rejected_total", "Ingest requests rejected, by reason", ["reason"],
                          registry=REGISTRY)
RATE_LIMITED = Counter("fleetprof_rate_limited_total", "Requests refused with 429 by the per-token rate limit",
                       registry=REGISTRY)
# status: the answer's HTTP status code ("500" when the app raised before answering)
REQUEST_LATENCY = Histogram("fleetprof_http_request_duration_seconds", "HTTP request latency", ["route", "status"],
                            registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
TASK_LATENCY = Histogram("fleetprof_task_duration_seconds", "Background task duration", ["task"], registry=REGISTRY)

# ------------------------------------------------------------------ Celery: queue depth and worker task latency

# kombu's Redis transport keeps one list per priority step (0, 3, 6, 9): the bare name, then name + sep + step.
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (3, 6, 9)
WORKER_TASK_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)


def celery_queue_keys(queue_name: str) -> list[str]:
    """The Redis lists holding the queue's pending tasks (server.worker sets global_keyprefix to `queue:`)."""
    prefix = f"{queue_name}:"
    return [prefix + queue_name] + [f"{prefix}{queue_name}{_PRIORITY_SEP}{p}" for p in _PRIORITY_STEPS]


def task_stats_key(queue_name: str) -> str:
    return f"{queue_name}:fleetprof:task_seconds"


def _bucket_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def record_task_duration(client: Any, queue_name: str, task: str, seconds: float) -> None:
    """Add one task duration to the shared per-task histogram in Redis (HINCRBY: safe from many workers)."""
    bound = next(b for b in WORKER_TASK_BUCKETS_S if seconds <= b)
    key = task_stats_key(queue_name)
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(key, f"{task}|{_bucket_label(bound)}", 1)
    pipe.hincrby(key, f"{task}|count", 1)
    pipe.hincrbyfloat(key, f"{task}|sum", seconds)
    pipe.execute()


class BrokerCollector(Collector):
    """`fleetprof_queue_depth` and `fleetprof_worker_task_duration_seconds`, read from Redis at scrape time
    (a pipeline of LLEN and one HGETALL). A broker that does not answer gives `fleetprof_broker_up 0`."""

    def __init__(self, client: Any, queue_name: str):
        self.client = client
        self.queue_name = queue_name

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("fleetprof_broker_up", "1 when the Celery broker answered this scrape")
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in celery_queue_keys(self.queue_name):
                pipe.llen(key)
            pipe.hgetall(task_stats_key(self.queue_name))
            *lengths, stats = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("broker unreachable at scrape time: %s", exc.__class__.__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily("fleetprof_queue_depth", "Tasks waiting in the Celery queue", labels=["queue"])
        depth.add_metric([self.queue_name], float(sum(lengths)))
        yield depth
        yield self._task_histogram(stats)

    def _task_histogram(self, stats: dict[bytes, bytes]) -> HistogramMetricFamily:
        family = HistogramMetricFamily("fleetprof_worker_task_duration_seconds",
                                       "Celery task run time, all workers (from Redis)", labels=["task"])
        per_task: dict[str, dict[str, float]] = {}
        for field, value in stats.items():
            task, _, part = field.decode().rpartition("|")
            per_task.setdefault(task, {})[part] = float(value)
        for task, parts in sorted(per_task.items()):
            cumulative, buckets = 0.0, []
            for bound in WORKER_TASK_BUCKETS_S:
                cumulative += parts.get(_bucket_label(bound), 0.0)
                buckets.append((_bucket_label(bound), cumulative))
            family.add_metric([task], buckets, parts.get("sum", 0.0))
        return family


def broker_collector(broker_url: str, queue_name: str) -> BrokerCollector:
    import redis

    client = redis.Redis.from_url(broker_url, socket_connect_timeout=0.5, socket_timeout=0.5)
    return BrokerCollector(client, queue_name)


# ------------------------------------------------------------------ worker side: time every task into Redis

_worker: dict[str, Any] = {}


def _worker_client() -> tuple[Any, str] | None:
    """The Redis client of this worker process (built after fork, hence keyed by pid), or None without a broker."""
    if _worker.get("pid") != os.getpid():
        from server.config import get_settings

        settings = get_settings()
        _worker.clear()
        _worker["pid"] = os.getpid()
        _worker["started"] = {}
        if settings.broker_url:
            import redis

            _worker["client"] = (redis.Redis.from_url(settings.broker_url, socket_connect_timeout=1,
                                                      socket_timeout=1), settings.queue_name)
    return _worker.get("client")


def _on_task_prerun(task_id: str | None = None, **_: Any) -> None:
    _worker_client()
    _worker["started"][task_id] = time.perf_counter()


def _on_task_postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    target = _worker_client()
    start = _worker.get("started", {}).pop(task_id, None)
    if target is None or start is None:
        return
    try:
        record_task_duration(target[0], target[1], getattr(task, "name", "unknown"), time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - losing a latency sample must never fail a task
        log.warning("could not record task duration: %s", exc.__class__.__name__)


def connect_task_signals() -> None:
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(_on_task_prerun, weak=False, dispatch_uid="fleetprof-task-prerun")
    task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="fleetprof-task-postrun")


# A Celery worker has imported celery before it imports the task modules (and so this one); the API process,
# which runs no Celery task, is spared the import.
if "celery" in sys.modules:
    connect_task_signals()
