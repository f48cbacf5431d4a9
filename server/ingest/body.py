"""Reading request bodies safely: size limits before and after gunzip, JSON that refuses NaN/Infinity."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from fastapi import Request

from server.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType


async def read_body(request: Request, *, max_bytes: int, max_decompressed_bytes: int) -> bytes:
    """The raw (gunzipped) body. 413 past either limit; the body is never buffered beyond the limit."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding == "gzip":
        return gunzip_bounded(body, max_decompressed_bytes)
    if encoding not in ("identity", ""):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
    return body


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """Decompress at most `limit` bytes: a zip bomb gets a 413, a truncated stream a 422."""
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decomp.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"body is not valid gzip: {exc}") from None
    if len(out) > limit or decomp.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
    if not decomp.eof:
        raise InvalidInput("gzip body is truncated")
    return out


def parse_json(body: bytes) -> Any:
    """Strict JSON (orjson rejects NaN and Infinity literals, which plain json.loads accepts)."""
    if not body:
        raise InvalidInput("empty request body: expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON: {exc}") from None
