"""POST /api/v1/ingest/samples and /api/v1/ingest/events."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from fleetprof.protocol import PROTOCOL_VERSION, EventBatch, IngestAck, SampleBatch
from server.auth.service import Principal
from server.db import session_scope
from server.deps import AgentAuth, DispatcherDep, EventWriterAuth, SettingsDep
from server.errors import InvalidInput, Overloaded
from server.ingest import service
from server.ingest.body import parse_json, read_body
from server.metrics import INGEST_BATCHES, INGEST_REJECTED, INGEST_SAMPLES
from server.nodes.service import NeedsDatabase

router = APIRouter(prefix="/api/v1/ingest", tags=["ingest"])

_BODY_DOC = {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/SampleBatch"}}},
                             "required": True}}


class InflightLimiter:
    """Bounded concurrent ingest: past the limit the collector sheds load with 503 + Retry-After."""

    def __init__(self, limit: int):
        self._sem = threading.BoundedSemaphore(limit)

    def __enter__(self) -> None:
        if not self._sem.acquire(blocking=False):
            INGEST_REJECTED.labels(reason="overload").inc()
            raise Overloaded("collector is at capacity; retry later", retry_after_s=2)

    def __exit__(self, *exc: object) -> None:
        self._sem.release()


def _validate(model, payload):
    if isinstance(payload, dict):
        version = payload.get("protocol_version")
        if version != PROTOCOL_VERSION:
            INGEST_REJECTED.labels(reason="protocol_version").inc()
            raise InvalidInput(f"unsupported protocol_version {version!r}; this server speaks {PROTOCOL_VERSION}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        INGEST_REJECTED.labels(reason="invalid").inc()
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidInput(f"invalid {model.__name__}: {where}: {first.get('msg')} "
                           f"({exc.error_count()} error(s))") from None


@router.post("/samples", response_model=IngestAck, openapi_extra=_BODY_DOC,
             responses={401: {}, 403: {}, 413: {}, 422: {}, 503: {}},
             summary="Ingest a batch of NVML samples (protocol v1, JSON, optionally gzip)")
async def ingest_samples(request: Request, principal: AgentAuth) -> IngestAck:
    # Served by SampleIngestFastPath (server/ingest/fastpath.py) in a running collector; this route documents
    # the endpoint and serves any app built without that middleware. Both call handle_samples.
    return await handle_samples(request, principal)


async def handle_samples(request: Request, principal: Principal) -> IngestAck:
    """Read, validate and authorise one sample batch, then wait until the group writer committed it."""
    state = request.app.state
    settings = state.settings
    with state.ingest_limiter:
        body = await read_body(request, max_bytes=settings.max_body_bytes,
                               max_decompressed_bytes=settings.max_decompressed_bytes)
        batch = _validate(SampleBatch, parse_json(body))
        prepare = functools.partial(service.prepare_samples, batch=batch, principal=principal,
                                    cache=state.inventory_cache, now=time.time(),
                                    max_future_skew_s=settings.max_future_skew_s)
        try:
            # The common case (inventory unchanged and cached) needs no I/O: no thread hop.
            prepared = prepare(None)
        except NeedsDatabase:
            def prepare_in_session() -> service.PreparedSamples:
                with session_scope(state.sessionmaker) as session:
                    return prepare(session)

            prepared = await run_in_threadpool(prepare_in_session)
        # Answered only once the writer committed the group this batch went into; the wait holds no thread.
        future = asyncio.wrap_future(state.sample_writer.submit(prepared))
        try:
            # shield: a timeout (or a client that hangs up) must not cancel the writer's future.
            result = await asyncio.wait_for(asyncio.shield(future), timeout=settings.ingest_timeout_s)
        except TimeoutError:
            # Not acknowledged: the agent resends, and a late commit makes that resend a duplicate.
            INGEST_REJECTED.labels(reason="timeout").inc()
            raise Overloaded(f"the database did not commit within {settings.ingest_timeout_s:g} s; retry",
                             retry_after_s=5) from None
        INGEST_BATCHES.labels(kind="samples", duplicate=str(result.duplicate).lower()).inc()
        INGEST_SAMPLES.inc(result.accepted)
        return IngestAck(accepted=result.accepted, duplicate=result.duplicate, server_time=time.time())


@router.post("/events", response_model=IngestAck,
             openapi_extra={"requestBody": {"content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/EventBatch"}}}, "required": True}},
             responses={401: {}, 403: {}, 404: {}, 413: {}, 422: {}, 503: {}},
             summary="Ingest framework events (job start/end, steps, layer stats, OOM)")
async def ingest_events(request: Request, principal: EventWriterAuth, settings: SettingsDep,
                        dispatcher: DispatcherDep) -> IngestAck:
    with request.app.state.ingest_limiter:
        body = await read_body(request, max_bytes=settings.max_body_bytes,
                               max_decompressed_bytes=settings.max_decompressed_bytes)

        def work() -> IngestAck:
            batch = _validate(EventBatch, parse_json(body))
            with session_scope(request.app.state.sessionmaker) as session:
                result = service.ingest_events(session, batch, principal=principal, now=time.time(),
                                               max_future_skew_s=settings.max_future_skew_s, settings=settings)
            INGEST_BATCHES.labels(kind="events", duplicate=str(result.duplicate).lower()).inc()
            for job_pk in result.jobs_ended:
                dispatcher.characterize(job_pk)
            return IngestAck(accepted=result.accepted, duplicate=result.duplicate, server_time=time.time())

        return await run_in_threadpool(work)
