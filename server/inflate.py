"""Request bodies sent with `Content-Encoding: gzip` are inflated here, for every route.

The REST client (fleetprof/client.py) gzips every body of 1 KiB or more, and HTTP makes the encoding a
property of the request, not of the route: registering a job with 10 KB of metadata was a 400 because only the
ingest routes inflated their bodies. So the rule lives in this one middleware, below the request guards (which
bound the body as sent, `FLEETPROF_MAX_BODY_BYTES`) and above everything that reads bodies (the ingest fast path,
FastAPI's routes): the body is inflated as it streams in, at most `FLEETPROF_MAX_DECOMPRESSED_BYTES` of it
(a decompression bomb is a 413 as soon as it passes the limit, never buffered), invalid or truncated gzip is a 422,
another encoding a 415. Plain ASGI: it runs on the ingest path.
"""

from __future__ import annotations

import zlib

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.ratelimit import answer_problem

# Set in the scope of a request whose body this middleware inflated: its bound is the decompressed limit.
INFLATED = "fleetprof.inflated"
_DROPPED = (b"content-encoding", b"content-length")  # they describe the body as sent, not as the app reads it


def _encoding(scope: Scope) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-encoding":
            return bytes(value).strip().lower()
    return b""


class InflateMiddleware:
    def __init__(self, app: ASGIApp, *, max_decompressed_bytes: int) -> None:
        self.app = app
        self.limit = max_decompressed_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoding = _encoding(scope) if scope["type"] == "http" else b""
        if encoding in (b"", b"identity"):
            await self.app(scope, receive, send)
            return
        if encoding != b"gzip":
            await answer_problem(send, 415, f"unsupported Content-Encoding {encoding.decode(errors='replace')!r} "
                                            "(use gzip or none)")
            return
        # In place, not a copy: the outer middlewares read what routing adds to this scope (the route).
        scope["headers"] = [(n, v) for n, v in scope["headers"] if n not in _DROPPED]
        scope[INFLATED] = True
        await self.app(scope, self._inflating(receive), send)

    def _inflating(self, receive: Receive) -> Receive:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        limit = self.limit
        produced = 0
        received = 0

        async def inflated() -> Message:
            # HTTPException, not a domain error: FastAPI turns any other exception raised while it reads a body
            # into a 400 (as in the request guard, server/ratelimit.py).
            nonlocal produced, received
            message = await receive()
            if message["type"] != "http.request":
                return message
            data = message.get("body", b"")
            received += len(data)
            try:
                out = inflater.decompress(data, limit - produced + 1) if data and not inflater.eof else b""
            except zlib.error as exc:
                raise HTTPException(422, f"body is not valid gzip: {exc}") from None
            produced += len(out)
            if produced > limit or inflater.unconsumed_tail:
                raise HTTPException(413, f"decompressed body exceeds the limit of {limit} bytes")
            if not message.get("more_body", False) and received and not inflater.eof:
                raise HTTPException(422, "gzip body is truncated")
            return {**message, "body": out}

        return inflated
