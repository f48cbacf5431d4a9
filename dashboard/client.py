"""Typed REST client of the fleetprof API: the dashboard's only way to its data."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from fleetprof.jobid import job_path

T = TypeVar("T")


class ApiError(Exception):
    """The API answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail


class EstimatorUnavailable(ApiError):
    """POST /api/v1/estimate is not served by this API (404)."""


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # pydantic's list of validation errors
        return "; ".join(f"{'.'.join(str(x) for x in e.get('loc', []))}: {e.get('msg')}" for e in detail)
    return str(detail if detail is not None else body)[:300]


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once: each new client built its own (loading the CA bundle, ~20 ms of
    CPU), and the dashboard opens a client per callback."""
    return httpx.create_ssl_context()


class ApiClient:
    """One method per endpoint; JSON in, plain dicts out (the API's own field names and units)."""

    def __init__(self, base_url: str, token: str | None, *, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                  transport=transport, verify=_ssl_context())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                 json: Any = None) -> httpx.Response:
        clean = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        try:
            response = self._http.request(method, path, params=clean, json=json)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"API unreachable at {self._http.base_url}: {exc.__class__.__name__}") from exc
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        return response

    def _get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params=params).json()

    # ------------------------------------------------------------------ jobs (team, scheduler, operator)
    def jobs(self, *, team: str | None = None, state: str | None = None, since: float | None = None,
             until: float | None = None, q: str | None = None, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        return self._get("/api/v1/jobs", team=team, state=state, since=since, until=until, q=q, limit=limit,
                         offset=offset)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._get(job_path(job_id))

    def report(self, job_id: str) -> dict[str, Any]:
        return self._get(job_path(job_id, "report"))

    def timeseries(self, job_id: str, metric: str, *, points: int = 1000, since: float | None = None,
                   until: float | None = None) -> dict[str, Any]:
        return self._get(job_path(job_id, "timeseries"), metric=metric, points=points, since=since,
                         until=until)

    def timeseries_batch(self, job_id: str, points: Mapping[str, int], *, since: float | None = None,
                         until: float | None = None) -> dict[str, dict[str, Any]]:
        """Several metrics at once, each with its points budget (the API reads each GPU's samples once for all):
        {metric: the /timeseries answer for it}."""
        return self._get(job_path(job_id, "timeseries", "batch"), metric=list(points),
                         points=list(points.values()), since=since, until=until)["metrics"]

    def steps(self, job_id: str, *, since: float | None = None, until: float | None = None,
              limit: int = 20_000, points: int | None = None) -> dict[str, Any]:
        """Per-step series; with `points`, downsampled per rank to about that many rows plus a step-time
        histogram of every step in the range (`wall_s_histogram`)."""
        return self._get(job_path(job_id, "steps"), since=since, until=until, limit=limit,
                         points=points)

    def report_html(self, job_id: str) -> str:
        # `format` as a parameter: httpx replaces a URL's own query string with the request's params
        return self._request("GET", job_path(job_id, "report"), params={"format": "html"}).text

    # ------------------------------------------------------------------ inventory and fleet (operator)
    def nodes(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/nodes")

    def gpus(self, node: str | None = None) -> list[dict[str, Any]]:
        return self._get("/api/v1/gpus", node=node)

    def fleet_summary(self, window: str = "24h") -> dict[str, Any]:
        return self._get("/api/v1/fleet/summary", window=window)

    def fleet_timeline(self, window: str = "24h") -> dict[str, Any]:
        return self._get("/api/v1/fleet/timeline", window=window)

    def fleet_headroom(self, window: str = "24h") -> dict[str, Any]:
        return self._get("/api/v1/fleet/headroom", window=window)

    # ------------------------------------------------------------------ estimator (scheduler, team, operator)
    def estimate(self, request: dict[str, Any]) -> dict[str, Any]:
        """POST /api/v1/estimate. Raises EstimatorUnavailable where the API has no such endpoint."""
        try:
            return self._request("POST", "/api/v1/estimate", json=request).json()
        except ApiError as exc:
            if exc.status in (404, 405):
                raise EstimatorUnavailable(exc.status, "the estimator is not available on this API") from exc
            raise

    # ------------------------------------------------------------------ who am I
    def scope(self) -> str:
        """'operator' or 'reader' (team/scheduler); raises ApiError(401) for a bad token."""
        try:
            self._get("/api/v1/nodes")
            return "operator"
        except ApiError as exc:
            if exc.status in (403, 404):
                self._get("/api/v1/jobs", limit=1)
                return "reader"
            raise


def gather(*calls: Callable[[], T]) -> list[T | ApiError]:
    """Run API calls at once (one ApiClient may be shared between threads: httpx pools its connections).
    Results in order; an ApiError is returned in its call's place, any other exception raised."""
    def run(call: Callable[[], T]) -> T | ApiError:
        try:
            return call()
        except ApiError as exc:
            return exc

    if len(calls) == 1:
        return [run(calls[0])]
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="api") as pool:
        return list(pool.map(run, calls))
