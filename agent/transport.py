"""HTTP transport from a node (agent, hooks, client commands) to the collector.

One place for: gzip-JSON bodies, the bearer token, mapping status codes to errors, and reading
`Retry-After`, and the delay rule before a retry (`retry_delay_s`). Whether to retry is the caller's policy: the
shipper retries forever, `fleetprof replay` for a bounded time (`Transport.request_retrying`), other CLI commands
fail fast.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

log = logging.getLogger(__name__)

UPLOAD_CHUNK_BYTES = 256 * 1024  # how often an upload with a progress callback reports (a 200 MB trace: ~800 times)


class TransportError(Exception):
    """The collector could not be reached or answered with an error."""

    def __init__(self, message: str, *, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        """Network errors, 408/429 and 5xx are worth retrying; other 4xx are final (bad input, auth)."""
        return self.status is None or self.status in (408, 429) or self.status >= 500


@dataclass(frozen=True)
class Response:
    status: int
    body: Any
    server_date_epoch_s: float | None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            from time import time

            return max(0.0, parsedate_to_datetime(value).timestamp() - time())
        except (TypeError, ValueError):
            return None


def retry_delay_s(exc: TransportError, attempt: int, *, base_s: float = 0.5, max_s: float = 60.0,
                  rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed attempt number `attempt` (1, 2, ...) of a retryable request: a `Retry-After`
    as given (plus up to 10% jitter, at most 1 s), else exponential backoff capped at `max_s`, half of it random,
    so that clients coming back after an outage do not stampede the collector."""
    if exc.retry_after_s is not None:
        return exc.retry_after_s + rng() * min(1.0, exc.retry_after_s * 0.1)
    ceiling = min(max_s, base_s * (2 ** min(attempt, 30)))
    return ceiling / 2 + rng() * ceiling / 2


def _error_message(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except (ValueError, AttributeError):
        detail = resp.text
    return f"{resp.request.method} {resp.request.url.path} -> HTTP {resp.status_code}: {detail}"


def _chunks(body: bytes, progress: Callable[[int], None]) -> Iterator[bytes]:
    view = memoryview(body)
    for start in range(0, len(body), UPLOAD_CHUNK_BYTES):
        yield bytes(view[start:start + UPLOAD_CHUNK_BYTES])
        progress(min(len(body), start + UPLOAD_CHUNK_BYTES))


class Transport:
    """A keep-alive HTTP client bound to one server URL and one token."""

    def __init__(self, server_url: str, token: str | None, *, timeout_s: float = 30.0,
                 client: httpx.Client | None = None, gzip_min_bytes: int = 1024):
        self.server_url = server_url.rstrip("/")
        self.token = token
        self.gzip_min_bytes = gzip_min_bytes
        self._client = client or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(self, method: str, path: str, *, json_body: Any = None, raw_body: bytes | None = None,
                content_type: str = "application/json", params: dict[str, Any] | None = None,
                compress: bool = True, progress: Callable[[int], None] | None = None) -> Response:
        """One request. `progress(bytes_sent)` is called as the body goes out (a body sent in chunks, with its
        Content-Length, so the server sees the same request)."""
        headers = self._headers()
        content: bytes | Iterator[bytes] | None = None
        if json_body is not None:
            raw_body = json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode()
        if raw_body is not None:
            headers["Content-Type"] = content_type
            if compress and len(raw_body) >= self.gzip_min_bytes:
                content = gzip.compress(raw_body, compresslevel=5)
                headers["Content-Encoding"] = "gzip"
            else:
                content = raw_body
            if progress is not None:
                headers["Content-Length"] = str(len(content))
                content = _chunks(content, progress)
        try:
            resp = self._client.request(method, self.server_url + path, content=content, headers=headers,
                                        params=params)
        except httpx.HTTPError as exc:
            raise TransportError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise TransportError(_error_message(resp), status=resp.status_code,
                                 retry_after_s=_retry_after(resp.headers.get("Retry-After")))
        date = resp.headers.get("Date")
        server_epoch = None
        if date:
            try:
                server_epoch = parsedate_to_datetime(date).timestamp()
            except (TypeError, ValueError):
                server_epoch = None
        ctype = resp.headers.get("Content-Type", "")
        body: Any = resp.json() if ctype.startswith("application/json") else resp.text
        return Response(resp.status_code, body, server_epoch)

    def post_json(self, path: str, payload: Any) -> Response:
        return self.request("POST", path, json_body=payload)

    def request_retrying(self, method: str, path: str, *, give_up_after_s: float, max_delay_s: float = 10.0,
                         sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> Response:
        """`request`, retried on retryable errors (network, 408, 429, 5xx; `retry_delay_s`) until it succeeds or
        the next wait would end past `give_up_after_s`; then the last error is raised. Only for idempotent
        requests (ingest batches are, by (agent, seq); job registration is an upsert)."""
        deadline = time.monotonic() + give_up_after_s
        attempt = 0
        while True:
            try:
                return self.request(method, path, **kwargs)
            except TransportError as exc:
                attempt += 1
                delay = retry_delay_s(exc, attempt, max_s=max_delay_s)
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise
                log.info("%s; retry %d in %.1f s", exc, attempt, delay)
                sleep(delay)

    def get_json(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).body
