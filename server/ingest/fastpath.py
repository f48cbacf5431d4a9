"""The hot path of the collector: POST /api/v1/ingest/samples answered without FastAPI's routing,
dependency solving and response validation.

Measured with bench/ingest.py (py-spy on the collector): for an 80-sample batch, routing, dependency injection
and response serialization cost more CPU than parsing, validating and writing the batch. This middleware sits
inside the request guards (rate limit, body size) and the observing middleware (latency, security headers),
resolves the token exactly as the `AgentAuth` dependency does, and calls the same handler as the documented
FastAPI route (server/ingest/router.py handle_samples); errors map to the same responses as the app's handlers.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from server.auth.service import require_scope
from server.deps import resolve_principal
from server.errors import error_response

PATH = "/api/v1/ingest/samples"


class SampleIngestFastPath:
    ROUTE = SimpleNamespace(path=PATH)  # what per-route metrics read from scope["route"]

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        from server.ingest.router import handle_samples

        scope["route"] = self.ROUTE
        request = Request(scope, receive)
        try:
            principal = require_scope(await resolve_principal(request, request.headers.get("authorization")),
                                      "agent")
            ack = await handle_samples(request, principal)
            response: Response = Response(orjson.dumps(ack.model_dump()), media_type="application/json")
        except Exception as exc:
            if (answer := error_response(exc)) is None:
                raise  # a bug: the server-error middleware answers 500 and logs the traceback
            response = answer
        await response(scope, receive, send)
