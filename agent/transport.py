"""HTTP transport from a node (agent, hooks, client commands) to the collector.

One place for: gzip-JSON bodies, the bearer token, mapping status codes to errors, and reading
`Retry-After`. Retrying is the caller's policy (the shipper backs off; a CLI command fails fast).
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

log = logging.getLogger(__name__)


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


def _error_message(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except (ValueError, AttributeError):
        detail = resp.text
    return f"{resp.request.method} {resp.request.url.path} -> HTTP {resp.status_code}: {detail}"


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
                compress: bool = True) -> Response:
        headers = self._headers()
        content: bytes | None = None
        if json_body is not None:
            raw_body = json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode()
        if raw_body is not None:
            headers["Content-Type"] = content_type
            if compress and len(raw_body) >= self.gzip_min_bytes:
                content = gzip.compress(raw_body, compresslevel=5)
                headers["Content-Encoding"] = "gzip"
            else:
                content = raw_body
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

    def get_json(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).body
