"""Streaming reads of PyTorch profiler (Kineto) trace files: `.json` or `.json.gz`, never loaded whole.

Peers load a trace into a DataFrame (~5x its size in RAM); we stream `traceEvents` with ijson so memory
stays bounded by one event, whatever the trace size.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import ijson

GZIP_MAGIC = b"\x1f\x8b"
EVENTS_KEY = "traceEvents"

# What a broken file makes ijson, gzip or zlib raise; all mean "not a readable trace".
_READ_ERRORS = (ijson.JSONError, EOFError, OSError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError)


class TraceFormatError(ValueError):
    """The file is not a readable Kineto trace (bad JSON, truncated gzip, no traceEvents)."""


class TraceTooLargeError(ValueError):
    """The decompressed trace is larger than the caller's limit (a 413, not a 422)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"trace is larger than {max_bytes} bytes once decompressed")
        self.max_bytes = max_bytes


class _LimitedReader(io.RawIOBase):
    """Counts the decompressed bytes read and refuses to go past `max_bytes` (gzip bombs included)."""

    def __init__(self, inner: IO[bytes], max_bytes: int | None) -> None:
        self._inner = inner
        self.max_bytes = max_bytes
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        n = len(data)
        self.bytes_read += n
        if self.max_bytes is not None and self.bytes_read > self.max_bytes:
            raise TraceTooLargeError(self.max_bytes)
        buffer[:n] = data
        return n

    def read(self, size: int = -1) -> bytes:
        # ijson's C backend calls read(n) directly; skip RawIOBase's extra copy.
        data = self._inner.read(size)
        self.bytes_read += len(data)
        if self.max_bytes is not None and self.bytes_read > self.max_bytes:
            raise TraceTooLargeError(self.max_bytes)
        return data

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


def open_trace(source: str | Path | bytes | IO[bytes], *, max_bytes: int | None = None) -> _LimitedReader:
    """A binary stream of the trace's JSON text, transparently gunzipped.

    A file-like `source` must be seekable (its first two bytes are peeked); closing the returned
    stream closes it. `max_bytes` bounds the decompressed size: reading past it raises
    `TraceTooLargeError`; `.bytes_read` says how much was read.
    """
    if isinstance(source, (str, Path)):
        raw: IO[bytes] = open(source, "rb")  # noqa: SIM115 - returned open; closing the result closes it
    elif isinstance(source, (bytes, bytearray, memoryview)):
        raw = io.BytesIO(bytes(source))
    else:
        raw = source
    start = raw.tell()
    head = raw.read(2)
    raw.seek(start)
    inner: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if head == GZIP_MAGIC else raw  # type: ignore[assignment]
    return _LimitedReader(inner, max_bytes)


def iter_events(stream: IO[bytes] | io.RawIOBase) -> Iterator[dict[str, Any]]:
    """Yield each element of `traceEvents` as a dict (numbers as int/float, not Decimal)."""
    try:
        yield from ijson.items(stream, f"{EVENTS_KEY}.item", use_float=True)
    except _READ_ERRORS as exc:
        raise TraceFormatError(f"unreadable trace: {exc.__class__.__name__}: {exc}") from exc


def read_header(stream: IO[bytes]) -> tuple[dict[str, Any], bool]:
    """Top-level keys written *before* `traceEvents`, and whether `traceEvents` was found.

    Stops reading at the `traceEvents` key, so it costs only the header. Kineto writes
    `schemaVersion`, `deviceProperties` and `distributedInfo` there; what it writes after the events
    (`traceName`, `displayTimeUnit`, `baseTimeNanoseconds`) is not read: it would cost a second full pass.
    """
    meta: dict[str, Any] = {}
    try:
        parser = ijson.parse(stream, use_float=True)
        first = next(parser, None)
        if first is None or first[1] != "start_map":
            raise TraceFormatError("a Kineto trace is a JSON object; this is not one")
        for key, value in _top_level_values(parser):
            if key == EVENTS_KEY:
                return meta, True
            meta[key] = value
    except _READ_ERRORS as exc:
        raise TraceFormatError(f"unreadable trace: {exc.__class__.__name__}: {exc}") from exc
    return meta, False


def _top_level_values(parser: Iterator[tuple[str, str, Any]]) -> Iterator[tuple[str, Any]]:
    """(key, value) for each top-level key before `traceEvents`, from an ijson.parse stream already past the
    opening `{`. `traceEvents` itself is yielded with no value: the caller stops there, nothing is built."""
    for prefix, event, value in parser:
        if event == "end_map" and prefix == "":
            return
        if event != "map_key" or prefix != "":
            continue
        key = value
        if key == EVENTS_KEY:
            # Its value must open a list: {"traceEvents": 5} was once read as a trace with no events.
            if next(parser, (None, None, None))[1] != "start_array":
                raise TraceFormatError(f"{EVENTS_KEY} must be a list of events")
            yield key, None
            return
        builder = ijson.ObjectBuilder()
        depth = 0
        for _, ev, val in parser:
            builder.event(ev, val)
            if ev in ("start_map", "start_array"):
                depth += 1
            elif ev in ("end_map", "end_array"):
                depth -= 1
            if depth == 0:
                break
        yield key, builder.value
