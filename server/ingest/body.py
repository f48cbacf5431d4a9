"""Reading request bodies safely: size limits (server/inflate.py inflates gzip), JSON that refuses NaN/Infinity."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request

from server.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from server.inflate import INFLATED


async def read_body(request: Request, *, max_bytes: int, max_decompressed_bytes: int) -> bytes:
    """The raw body, gunzipped by server.inflate.InflateMiddleware when it was sent gzip. 413 past the limit that
    applies (`max_bytes` as sent, `max_decompressed_bytes` once inflated); never buffered beyond it. The request
    guards enforce the same limits before this; this bound holds for any app built without them."""
    inflated = bool(request.scope.get(INFLATED))
    limit = max_decompressed_bytes if inflated else max_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"{'decompressed ' if inflated else ''}request body exceeds the limit of "
                                  f"{limit} bytes")
        chunks.append(chunk)
    if request.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
        # Only without the middleware (it inflates gzip and refuses any other encoding).
        raise UnsupportedMediaType("this app reads no encoded bodies: build it with server.app.create_app")
    return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    """Strict JSON (orjson rejects NaN and Infinity literals, which plain json.loads accepts)."""
    if not body:
        raise InvalidInput("empty request body: expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON: {exc}") from None
