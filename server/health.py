"""/healthz (liveness), /readyz (database and broker reachable), /metrics (Prometheus)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import text

from server.metrics import REGISTRY

router = APIRouter(tags=["health"])

READY_TIMEOUT_S = 2.0
# Probe threads; a probe stuck on a frozen database occupies one until its socket gives up (keepalives).
_PROBES = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleetprof-readyz")


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: database and broker reachable",
            responses={503: {"description": "a dependency is down"}})
def readyz(request: Request) -> JSONResponse:
    checks: dict[str, str] = {}

    def ping() -> None:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # A frozen database answers nothing at all: the probe must say "not ready" within its own deadline.
    future = _PROBES.submit(ping)
    try:
        future.result(timeout=READY_TIMEOUT_S)
        checks["database"] = "ok"
    except FutureTimeout:
        checks["database"] = f"error: no answer within {READY_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {exc.__class__.__name__}"
    broker = request.app.state.broker_check
    if broker is not None:
        checks["broker"] = broker()
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503,
                        headers=None if ok else {"Retry-After": "5"})


@router.get("/metrics", summary="Prometheus metrics (service + DCGM-compatible fleet gauges)",
            response_class=Response)
def metrics(request: Request) -> Response:
    from server.fleet.prometheus import fleet_gauges_text

    body = generate_latest(REGISTRY).decode()
    broker = _broker_registry(request)
    if broker is not None:
        body += generate_latest(broker).decode()
    body += fleet_gauges_text(request.app.state.sessionmaker)
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
