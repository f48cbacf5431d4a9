"""The service's own Prometheus metrics (a private registry: tests build many apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

INGEST_SAMPLES = Counter("fleetprof_ingest_samples_total", "GPU samples stored", registry=REGISTRY)
INGEST_BATCHES = Counter("fleetprof_ingest_batches_total", "Ingest batches acknowledged", ["kind", "duplicate"],
                         registry=REGISTRY)
INGEST_REJECTED = Counter("fleetprof_ingest_rejected_total", "Ingest requests rejected, by reason", ["reason"],
                          registry=REGISTRY)
REQUEST_LATENCY = Histogram("fleetprof_http_request_duration_seconds", "HTTP request latency", ["route"],
                            registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
TASK_LATENCY = Histogram("fleetprof_task_duration_seconds", "Background task duration", ["task"], registry=REGISTRY)
