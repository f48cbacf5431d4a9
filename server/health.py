"""/healthz (liveness), /readyz (can accept ingest: database reachable and migrated), /healthz/broker (the
Celery broker, its own signal), /metrics (Prometheus: this process's own metrics, with `fleetprof_broker_up`),
/metrics/fleet (the fleet's figures, scraped once)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from server.metrics import REGISTRY
from server.migrate import schema_state

router = APIRouter(tags=["health"])

READY_TIMEOUT_S = 2.0
# Probe threads; a probe stuck on a frozen database occupies one until its socket gives up (keepalives).
_PROBES = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleetprof-readyz")


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _within_deadline(probe: Callable[[], str]) -> str:
    # A frozen database answers nothing at all: the probe must say "not ready" within its own deadline.
    future = _PROBES.submit(probe)
    try:
        return future.result(timeout=READY_TIMEOUT_S)
    except FutureTimeout:
        return f"error: no answer within {READY_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        return f"error: {exc.__class__.__name__}"


def _broker_status(request: Request) -> str:
    check = request.app.state.broker_check
    return "not used (tasks run in-process)" if check is None else _within_deadline(check)


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(description="each check's answer: 'ok ...' or 'error: ...'")
    broker: str = Field(description="reported beside the checks, not one of them")


class BrokerHealth(BaseModel):
    status: Literal["ok", "unavailable"]
    broker: str


@router.get("/readyz", response_model=Readiness,
            summary="Readiness: can accept ingest (database reachable and migrated to this code's head)",
            responses={503: {"model": Readiness, "description": "the database is down or not migrated"}})
def readyz(request: Request) -> JSONResponse:
    """Ingest needs the database only: a broker outage delays characterization, not ingest, so it must not take
    collectors out of rotation. The broker's state is reported beside the checks (and at /healthz/broker)."""

    def schema() -> str:
        with request.app.state.engine.connect() as conn:
            return schema_state(conn).summary

    database = _within_deadline(schema)
    ok = database.startswith("ok")
    body = {"status": "ok" if ok else "unavailable", "checks": {"database": database},
            "broker": _broker_status(request)}
    return JSONResponse(body, status_code=200 if ok else 503, headers=None if ok else {"Retry-After": "5"})


@router.get("/healthz/broker", response_model=BrokerHealth,
            summary="The Celery broker (Redis) answers; not part of readiness",
            responses={503: {"model": BrokerHealth, "description": "the broker does not answer"}})
def broker_health(request: Request) -> JSONResponse:
    status = _broker_status(request)
    ok = not status.startswith("error")
    return JSONResponse({"status": "ok" if ok else "unavailable", "broker": status}, status_code=200 if ok else 503)


@router.get("/metrics", summary="Prometheus metrics of this collector process (scrape every collector)",
            response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"}})
def metrics(request: Request) -> Response:
    """The service's own metrics: ingest, HTTP latency by route and status, tasks, and in cluster mode the broker.
    GPU series come from the agents (`FLEETPROF_AGENT_METRICS_PORT`), fleet figures from `/metrics/fleet`."""
    body = generate_latest(REGISTRY).decode()
    broker = _broker_registry(request)
    if broker is not None:
        body += generate_latest(broker).decode()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics/fleet", summary="Prometheus metrics of the whole fleet (scrape ONCE per fleet, not per "
            "collector)", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"}})
def fleet_metrics(request: Request) -> Response:
    """Read from the database, so every collector answers the same: scrape one of them (one scrape job with one
    target), or each figure appears once per collector. `fleetprof_rollup_backlog_hours`, the nodes and GPUs
    reporting, and with `FLEETPROF_FLEET_METRICS_GPU_GAUGES` every GPU's latest stored sample under dcgm-exporter's
    names (what /metrics carried before the agents exported them)."""
    from server.fleet.prometheus import fleet_metrics_text

    state = request.app.state
    body = fleet_metrics_text(state.sessionmaker, gpu_gauges=state.settings.fleet_metrics_gpu_gauges)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _broker_registry(request: Request) -> CollectorRegistry | None:
    """Queue depth and worker task latency, read from Redis at scrape time (cluster mode only). Built on the
    first scrape and kept on the app: one Redis connection pool per app."""
    state = request.app.state
    if not hasattr(state, "broker_metrics"):
        settings = state.settings
        registry = None
        if settings.broker_url:
            from server.metrics import broker_collector

            registry = CollectorRegistry(auto_describe=False)
            registry.register(broker_collector(settings.broker_url, settings.queue_name))
        state.broker_metrics = registry
    return state.broker_metrics
