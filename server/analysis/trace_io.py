"""Streaming reads of PyTorch profiler (Kineto) trace files: `.json` or `.json.gz`, never loaded whole.

Peers load a trace into a DataFrame (~5x its size in RAM); we stream `traceEvents` with ijson so memory
stays bounded by one event, whatever the trace size.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import ijson

GZIP_MAGIC = b"\x1f\x8b"


class TraceFormatError(ValueError):
    """The file is not a readable Kineto trace (bad JSON, truncated gzip, no traceEvents)."""


def open_trace(source: str | Path | bytes | IO[bytes]) -> IO[bytes]:
    """A binary stream of the trace's JSON text, transparently gunzipped."""
    if isinstance(source, (str, Path)):
        raw: IO[bytes] = open(source, "rb")
    elif isinstance(source, bytes):
        raw = io.BytesIO(source)
    else:
        raw = source
    head = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw) if head == GZIP_MAGIC else raw  # type: ignore[return-value]


def iter_events(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    """Yield each element of `traceEvents` as a dict (numbers as int/float, not Decimal)."""
    try:
        yield from ijson.items(stream, "traceEvents.item", use_float=True)
    except (ijson.JSONError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(f"unreadable trace: {exc.__class__.__name__}: {exc}") from exc


def read_metadata(stream: IO[bytes]) -> dict[str, Any]:
    """Top-level keys other than `traceEvents` (distributedInfo, deviceProperties, schemaVersion...).

    Streams the whole file once; events are skipped without being built.
    """
    meta: dict[str, Any] = {}
    try:
        for key, value in ijson.kvitems(stream, "", use_float=True):
            if key != "traceEvents":
                meta[key] = value
    except (ijson.JSONError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(f"unreadable trace: {exc.__class__.__name__}: {exc}") from exc
    return meta
