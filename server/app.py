"""The FastAPI application factory. Engines, caches and the task dispatcher are built in the lifespan."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from fastapi.routing import APIRoute

from server.config import ServerSettings, get_settings
from server.errors import API_ERROR_RESPONSES, PROBLEM_CONTENT, Problem

log = logging.getLogger(__name__)

API_DESCRIPTION = """Collector and REST API of fleetprof: ingest of NVML telemetry and framework events, job
characterization reports, right-sizing and pre-training estimates. Authenticate with `Authorization: Bearer <token>`
(`fleetprof token create`). Units are in every field name; unknown values are `null`."""


def _broker_check(settings: ServerSettings):
    url = settings.broker_url
    if not url:
        return None

    def check() -> str:
        import redis

        try:
            redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
            return "ok"
        except Exception as exc:  # noqa: BLE001
            return f"error: {exc.__class__.__name__}"

    return check


class ObserveMiddleware:
    """Request latency per route and status, and security headers, as a plain ASGI middleware
    (BaseHTTPMiddleware costs a task and a memory stream per request, too much on the ingest path)."""

    HEADERS = [(b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store")]

    def __init__(self, app, latency) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = "500"  # what the client sees when the app raises before it answers

        async def send_with_headers(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
                names = {k for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [h for h in self.HEADERS if h[0] not in names]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            route = scope.get("route")
            # path_format: the template without convertors (/api/v1/jobs/{job_id}, not {job_id:job_id})
            label = getattr(route, "path_format", None) or getattr(route, "path", "unmatched")
            self.latency.labels(route=label, status=status).observe(time.perf_counter() - start)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from server.auth.service import TokenCache
        from server.db import make_engine, make_sessionmaker
        from server.dispatch import CeleryDispatcher, Dispatcher, InProcessDispatcher
        from server.ingest.router import InflightLimiter
        from server.ingest.writer import SampleWriter
        from server.nodes.service import InventoryCache

        engine = make_engine(settings)
        factory = make_sessionmaker(engine)
        if settings.embedded:
            from server.migrate import upgrade

            upgrade(settings)  # embedded mode migrates itself; cluster mode runs `fleetprof db upgrade`
        if settings.broker_url:
            from server.jobs.tasks import CHARACTERIZE_TASK
            from server.worker import create_celery_app

            dispatcher: Dispatcher = CeleryDispatcher(create_celery_app(settings), characterize_task=CHARACTERIZE_TASK)
        else:
            from server.jobs.report_store import characterize_job_pk

            dispatcher = InProcessDispatcher(characterize=partial(characterize_job_pk, factory, settings=settings))
        app.state.settings = settings
        app.state.engine = engine
        app.state.sessionmaker = factory
        app.state.dispatcher = dispatcher
        app.state.token_cache = TokenCache()
        app.state.inventory_cache = InventoryCache()
        app.state.ingest_limiter = InflightLimiter(settings.max_inflight_ingest)
        app.state.broker_check = _broker_check(settings)
        app.state.sample_writer = SampleWriter(factory, writers=settings.ingest_writers)
        try:
            yield
        finally:
            app.state.sample_writer.close()
            dispatcher.close()
            engine.dispose()

    app = FastAPI(title="fleetprof", version="1.0", description=API_DESCRIPTION, lifespan=lifespan,
                  generate_unique_id_function=operation_id)

    from server.captures.router import router as captures_router
    from server.errors import install_error_handlers
    from server.estimate.router import router as estimate_router
    from server.fleet.dashboard_router import router as fleet_views_router
    from server.fleet.router import router as fleet_router
    from server.health import router as health_router
    from server.ingest.router import router as ingest_router
    from server.jobs.router import recurring_router
    from server.jobs.router import router as jobs_router
    from server.metrics import REQUEST_LATENCY
    from server.nodes.router import router as nodes_router
    from server.traces.router import router as traces_router

    install_error_handlers(app)
    app.include_router(health_router)
    # captures and traces before jobs: the jobs router's catch-all `GET /jobs/{job_id}/{rest}` answers 404
    for r in (ingest_router, captures_router, traces_router, jobs_router, recurring_router, nodes_router, fleet_router,
              fleet_views_router, estimate_router):
        app.include_router(r, responses=API_ERROR_RESPONSES)  # all authenticated: 401/403/404/422/429 as Problem

    from server.inflate import InflateMiddleware
    from server.ingest.fastpath import SampleIngestFastPath
    from server.job_paths import EncodedSlashMiddleware
    from server.ratelimit import RequestGuardMiddleware  # inside ObserveMiddleware: 429/413 get its headers
    app.add_middleware(EncodedSlashMiddleware)  # innermost: the router sees a job id's %2F as part of it
    app.add_middleware(SampleIngestFastPath)  # inside the guards: rate and size limits apply to it as to all
    app.add_middleware(InflateMiddleware, max_decompressed_bytes=settings.max_decompressed_bytes)  # gzip, any route
    app.add_middleware(RequestGuardMiddleware, settings=settings)
    app.add_middleware(ObserveMiddleware, latency=REQUEST_LATENCY)
    _document_protocol_bodies(app)
    return app


def operation_id(route: APIRoute) -> str:
    """`<tag>-<function name>` (`jobs-get_report`, `ingest-ingest_samples`): readable, stable while the function
    keeps its name, and unique (tests/server/test_api_conventions.py checks). FastAPI's default was
    `get_report_api_v1_jobs__job_id__report_get`."""
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def _document_protocol_bodies(app: FastAPI) -> None:
    """The ingest routes read their (gzip, size-bounded) body raw and point at the wire-protocol models by
    $ref; FastAPI does not register models it never parses, so add their schemas to the document. The same for
    `Problem`, the body of every error response (server/errors.py): every 4xx/5xx an API route declares with an
    empty entry (`{409: {}}`) is given that body."""
    from fleetprof.protocol import EventBatch, SampleBatch

    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = generate()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in (SampleBatch, EventBatch, Problem):
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            for item in doc.get("paths", {}).values():
                for op in item.values():
                    for status, response in op.get("responses", {}).items():  # health answers its own bodies
                        if op.get("security") and status[:1] in "45" and not response.get("content"):
                            response["content"] = PROBLEM_CONTENT
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
