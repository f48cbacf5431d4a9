"""Request guards in front of every route: per-token rate limits (429 + Retry-After) and body size limits (413).

A plain ASGI middleware (no BaseHTTPMiddleware: the ingest path is hot). Buckets are keyed by the SHA-256 of the
bearer token, so no plaintext token is held here; requests without a token are not limited here (they get a
401 before any work). The state is per collector process: N collectors behind a load balancer allow N times
the configured rate, which is the point of the limit (no client can saturate one collector), not a quota.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import orjson
from starlette.exceptions import HTTPException

from server.config import ServerSettings
from server.errors import PROBLEM_MEDIA_TYPE, problem_body
from server.metrics import INGEST_REJECTED, RATE_LIMITED

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Liveness, readiness and scrapes must answer even when a client is being throttled.
EXEMPT_PATHS = frozenset({"/healthz", "/healthz/broker", "/readyz", "/metrics", "/metrics/fleet"})
MAX_BUCKETS = 100_000  # least recently used buckets are forgotten past this (a forgotten bucket starts full)


class TokenBuckets:
    """One token bucket per key: `rate_per_s` sustained, `burst` at most at once. Not thread-safe: the
    middleware runs on the event loop."""

    def __init__(self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_BUCKETS):
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # key -> (tokens, updated)

    def take(self, key: bytes) -> float:
        """0.0 when the request may go, else the seconds until one token is back."""
        now = self.clock()
        tokens, updated = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - updated) * self.rate_per_s)
        wait_s = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait_s = (1.0 - tokens) / self.rate_per_s
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait_s


def _bearer_digest(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            if value[:7].lower() != b"bearer ":
                return None
            # The same digest server.auth.service.hash_token computes, without the hex round trip.
            return hashlib.sha256(value[7:].strip()).digest()
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def answer_problem(send: Send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """An error answered by a plain ASGI middleware, in the one problem-details shape (server/errors.py)."""
    body = orjson.dumps(problem_body(status, detail, headers={k.decode(): v.decode() for k, v in headers}))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class RequestGuardMiddleware:
    """429 + Retry-After past a token's rate; 413 for a body over the limit (declared or streamed)."""

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.settings = settings
        self.buckets = (TokenBuckets(settings.rate_limit_per_s, settings.rate_limit_burst)
                        if settings.rate_limit_per_s > 0 else None)

    def _body_limit(self, scope: Scope) -> int:
        # Trace uploads are large by nature (Kineto JSON); everything else shares the ingest body limit.
        if scope["method"] == "POST" and scope["path"].endswith("/traces"):
            return self.settings.max_trace_upload_bytes
        return self.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.buckets is not None and (digest := _bearer_digest(scope)) is not None:
            wait_s = self.buckets.take(digest)
            if wait_s > 0:
                RATE_LIMITED.inc()
                if scope["path"].startswith("/api/v1/ingest/"):
                    INGEST_REJECTED.labels(reason="rate_limited").inc()
                await answer_problem(send, 429, "rate limit of this token exceeded; retry later",
                                     [(b"retry-after", str(max(1, math.ceil(wait_s))).encode())])
                return
        limit = self._body_limit(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            if scope["path"].startswith("/api/v1/ingest/"):
                INGEST_REJECTED.labels(reason="too_large").inc()
            await answer_problem(send, 413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
            return
        received = 0

        async def bounded_receive() -> Message:
            # A chunked body carries no Content-Length: count as it streams in. HTTPException (not a domain
            # error) because FastAPI turns any other exception raised while it reads the body into a 400.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if scope["path"].startswith("/api/v1/ingest/"):
                        INGEST_REJECTED.labels(reason="too_large").inc()
                    raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
            return message

        await self.app(scope, bounded_receive, send)
