"""The one REST client of the fleetprof API, and the Python SDK schedulers use.

    from fleetprof.client import Client

    with Client("http://collector:8000", token) as api:
        report = api.report("train-42")                 # fleetprof.report.JobReport (typed, frozen)
        advice = api.rightsizing(name="nightly-bert")   # the next run of a recurring job
        est = api.estimate({"model": {"hf_config": "gpt2"}, "batch_size": 8, "seq_len": 1024})

Every side talks to the collector through it: the node agent's shipper and hooks (`request` with a gzip body,
`retry_delay_s` for their own retry policy), the CLI's client commands (fleetprof/commands/), the dashboard
(dashboard/client.py) and a scheduler's script. One place for: the bearer token, gzip-JSON bodies, mapping an
error answer (RFC 9457 problem details or FastAPI's `detail`) to `ApiError`, reading `Retry-After`, and the delay
before a retry. Whether to retry is the caller's policy: the shipper retries forever, `fleetprof replay` for a
bounded time (`request_retrying`), other commands and the dashboard fail fast.

Typed results: `report` returns `fleetprof.report.JobReport`; the other answers are the API's JSON as plain dicts
(its own field names, units in the names: docs/PRODUCT.md), since their types live with the server.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import random
import re
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httpx

from fleetprof.jobid import job_path
from fleetprof.settings import ClientSettings, connection, load_client_settings

if TYPE_CHECKING:  # imported where used: the node agent ships batches with this client and never needs these
    # models (their pydantic schemas cost it ~4 MB of RSS and 0.1 s of start-up)
    from fleetprof.api_models import Capture, CharacterizationOut, CompareOut, ProjectionOut
    from fleetprof.report import JobReport

log = logging.getLogger(__name__)

Json = dict[str, Any]

JOBS_PATH = "/api/v1/jobs"
INGEST_SAMPLES_PATH = "/api/v1/ingest/samples"
INGEST_EVENTS_PATH = "/api/v1/ingest/events"
ESTIMATE_PATH = "/api/v1/estimate"
UPLOAD_CHUNK_BYTES = 256 * 1024  # how often an upload with a progress callback reports (a 200 MB trace: ~800 times)
ESTIMATE_GRACE_S = 30.0  # waited past an estimate's server-side limit: the answer still has to come back
DETAIL_MAX_CHARS = 300  # of an error body without a `detail` (an HTML page from a proxy)


class ApiError(Exception):
    """The API answered with an error status, or could not be reached (`status` None).

    `detail` is the server's own explanation (problem details' `detail`; a validation error's fields joined);
    `retry_after_s` its `Retry-After`, when it sent one."""

    def __init__(self, status: int | None, detail: str, *, method: str | None = None, path: str | None = None,
                 retry_after_s: float | None = None):
        self.status = status
        self.detail = detail
        self.method = method
        self.path = path
        self.retry_after_s = retry_after_s
        where = f"{method} {path}" if method and path else None
        if status is None:
            message = f"{where}: {detail}" if where else detail
        else:
            message = f"{where} -> HTTP {status}: {detail}" if where else f"{status}: {detail}"
        super().__init__(message)

    @property
    def unreachable(self) -> bool:
        """No answer at all: connection refused, DNS, timeout."""
        return self.status is None

    @property
    def retryable(self) -> bool:
        """Network errors, 408/429 and 5xx are worth retrying; other 4xx are final (bad input, auth)."""
        return self.status is None or self.status in (408, 429) or self.status >= 500


class EstimatorUnavailable(ApiError):
    """POST /api/v1/estimate is not served by this API (404/405)."""


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # parsed JSON where the answer is JSON, else its text
    server_date_epoch_s: float | None  # the answer's `Date` header (the shipper's clock-skew estimate)


@dataclass(frozen=True)
class Download:
    """A downloaded file: `content` byte for byte as the server sent it (no decompression)."""

    content: bytes
    media_type: str
    filename: str | None  # from Content-Disposition


def _attachment_name(value: str | None) -> str | None:
    """The file name of `attachment; filename="x"` (or `filename*=utf-8''x`), its folder parts removed."""
    if not value:
        return None
    m = re.search(r"filename\*=(?:utf-8|UTF-8)''([^;]+)", value) or re.search(r'filename="([^"]*)"', value)
    if not m:
        return None
    name = unquote(m.group(1)).replace("\\", "/").rsplit("/", 1)[-1]
    return name if name not in ("", ".", "..") else None


def retry_delay_s(exc: ApiError, attempt: int, *, base_s: float = 0.5, max_s: float = 60.0,
                  rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed attempt number `attempt` (1, 2, ...) of a retryable request: a `Retry-After`
    as given (plus up to 10% jitter, at most 1 s), else exponential backoff capped at `max_s`, half of it random,
    so that clients coming back after an outage do not stampede the collector."""
    if exc.retry_after_s is not None:
        return exc.retry_after_s + rng() * min(1.0, exc.retry_after_s * 0.1)
    ceiling = min(max_s, base_s * (2 ** min(attempt, 30)))
    return ceiling / 2 + rng() * ceiling / 2


def _http_date_epoch_s(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _retry_after_s(value: str | None) -> float | None:
    """`Retry-After` in seconds: delay-seconds, or an HTTP date (then from now); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        at = _http_date_epoch_s(value)
        return None if at is None else max(0.0, at - time.time())


def _detail(response: httpx.Response) -> str:
    """The server's explanation of an error answer: problem details' `detail` whole (its advice may come last),
    pydantic's list of validation errors as `loc: msg` pairs, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:DETAIL_MAX_CHARS] or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(x) for x in e.get('loc', []))}: {e.get('msg')}" if isinstance(e, dict)
                         else str(e) for e in detail)
    return str(detail) if detail is not None else str(body)[:DETAIL_MAX_CHARS]


def _chunks(body: bytes, progress: Callable[[int], None]) -> Iterator[bytes]:
    view = memoryview(body)
    for start in range(0, len(body), UPLOAD_CHUNK_BYTES):
        yield bytes(view[start:start + UPLOAD_CHUNK_BYTES])
        progress(min(len(body), start + UPLOAD_CHUNK_BYTES))


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once: each new client built its own (loading the CA bundle, ~20 ms of
    CPU), and the dashboard opens a client per callback."""
    return httpx.create_ssl_context()


def _present(params: Mapping[str, Any]) -> dict[str, Any]:
    """Query parameters without the unset ones (None, "")."""
    return {k: v for k, v in params.items() if v is not None and v != ""}


class Client:
    """A keep-alive HTTP client bound to one server URL and one token; thread-safe (httpx pools connections).

    `http_client` or `transport` replace the network in tests and benchmarks (an `httpx.Client` of their own, or
    an `httpx.MockTransport`)."""

    def __init__(self, server_url: str, token: str | None, *, timeout_s: float = 30.0,
                 gzip_min_bytes: int = 1024, http_client: httpx.Client | None = None,
                 transport: httpx.BaseTransport | None = None):
        self.server_url = server_url.rstrip("/")
        self.token = token
        self.gzip_min_bytes = gzip_min_bytes
        self._http = http_client or httpx.Client(timeout=timeout_s, transport=transport, verify=_ssl_context())

    @classmethod
    def from_settings(cls, settings: ClientSettings | None = None, *, timeout_s: float = 30.0) -> Client:
        """A client to FLEETPROF_SERVER_URL with FLEETPROF_TOKEN (fleetprof.settings); ConnectionUnset (a
        ValueError) when either is unset."""
        server_url, token = connection(settings or load_client_settings())
        return cls(server_url, token, timeout_s=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    # ------------------------------------------------------------------------------------------------ transport
    def request(self, method: str, path: str, *, json_body: Any = None, raw_body: bytes | None = None,
                content_type: str = "application/json", params: Mapping[str, Any] | None = None,
                compress: bool = True, progress: Callable[[int], None] | None = None,
                timeout_s: float | None = None) -> Response:
        """One request; an error answer or no answer raises ApiError. A body of `gzip_min_bytes` or more goes
        gzip-compressed unless `compress=False`. `progress(bytes_sent)` is called as the body goes out (sent in
        chunks, with its Content-Length, so the server sees the same request). Unset params are left out;
        `timeout_s` replaces the client's own for this request."""
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
            resp = self._http.request(method, self.server_url + path, content=content, headers=headers,
                                      params=_present(params or {}),
                                      timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s)
        except httpx.HTTPError as exc:
            raise ApiError(None, f"unreachable at {self.server_url}: {exc.__class__.__name__}: {exc}",
                           method=method, path=path) from exc
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _detail(resp), method=method, path=path,
                           retry_after_s=_retry_after_s(resp.headers.get("Retry-After")))
        ctype = resp.headers.get("Content-Type", "")
        body: Any = resp.json() if ctype.startswith("application/json") else resp.text
        return Response(resp.status_code, body, _http_date_epoch_s(resp.headers.get("Date")))

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
            except ApiError as exc:
                attempt += 1
                delay = retry_delay_s(exc, attempt, max_s=max_delay_s)
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise
                log.info("%s; retry %d in %.1f s", exc, attempt, delay)
                sleep(delay)

    def get_json(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).body

    def post_json(self, path: str, payload: Any, **params: Any) -> Any:
        return self.request("POST", path, json_body=payload, params=params).body

    # ------------------------------------------------------------------------------- jobs (team, scheduler, operator)
    def register_job(self, job: Mapping[str, Any]) -> Json:
        """POST /api/v1/jobs: create or update a job (an upsert by job_id: job_id, team, name, state, ...)."""
        body: Json = self.post_json(JOBS_PATH, dict(job))
        return body

    def jobs(self, *, team: str | None = None, state: str | None = None, since: float | None = None,
             until: float | None = None, q: str | None = None, limit: int = 50, offset: int = 0,
             fingerprint: str | None = None) -> Json:
        """GET /api/v1/jobs: one page of jobs ({"items": [...], "total": n}), newest first; `fingerprint`: the
        runs of one model."""
        body: Json = self.get_json(JOBS_PATH, team=team, state=state, since=since, until=until, q=q, limit=limit,
                                   offset=offset, fingerprint=fingerprint)
        return body

    def job(self, job_id: str) -> Json:
        body: Json = self.get_json(job_path(job_id))
        return body

    def compare(self, job_ids: list[str]) -> CompareOut:
        """GET /api/v1/jobs/compare: the runs side by side, the first the baseline, with what each applied."""
        from fleetprof.api_models import CompareOut

        return CompareOut.model_validate(self.get_json(f"{JOBS_PATH}/compare", ids=",".join(job_ids)))

    def characterization(self, *, fingerprint: str | None = None, job_ids: list[str] | None = None,
                         limit: int = 50) -> CharacterizationOut:
        """GET /api/v1/jobs/characterization: one model across configurations, for a fingerprint or chosen runs."""
        from fleetprof.api_models import CharacterizationOut

        return CharacterizationOut.model_validate(self.get_json(
            f"{JOBS_PATH}/characterization", fingerprint=fingerprint,
            ids=",".join(job_ids) if job_ids is not None else None, limit=limit))

    def report(self, job_id: str, *, refresh: bool = False) -> JobReport:
        """The job's characterization, typed. `refresh` recomputes it now instead of a cached report."""
        from fleetprof.report import JobReport

        return JobReport.model_validate(self.report_json(job_id, refresh=refresh))

    def report_json(self, job_id: str, *, refresh: bool = False) -> Json:
        """The report as the API sent it (for printing it unchanged, e.g. `fleetprof report --format json`)."""
        body: Json = self.get_json(job_path(job_id, "report"), refresh="true" if refresh else None)
        return body

    def report_html(self, job_id: str, *, refresh: bool = False) -> str:
        # `format` as a parameter: httpx replaces a URL's own query string with the request's params
        body: str = self.get_json(job_path(job_id, "report"), format="html", refresh="true" if refresh else None)
        return body

    def rightsizing(self, job_id: str | None = None, *, name: str | None = None, team: str | None = None,
                    history: int = 50) -> Json:
        """What to request (GPU type and count, batch size, power cap) with reasons: for a job (`job_id`), or
        for the next run of a recurring job (`name`, with `team` where the token is not a team's)."""
        if (job_id is None) == (name is None):
            raise ValueError("rightsizing takes a job_id or a name, one of the two")
        if job_id is not None:
            if team is not None:
                raise ValueError("team goes with name")
            body: Json = self.get_json(job_path(job_id, "rightsizing"), history=history)
        else:
            body = self.get_json("/api/v1/rightsizing", name=name, team=team, history=history)
        return body

    def projection(self, job_id: str, gpu: str) -> ProjectionOut:
        """GET /api/v1/jobs/{job_id}/projection: the job's step time, power, energy per step and memory projected
        onto the GPU type `gpu` (a catalogue name), each with its band."""
        from fleetprof.api_models import ProjectionOut

        return ProjectionOut.model_validate(self.get_json(job_path(job_id, "projection"), gpu=gpu))

    def timeseries(self, job_id: str, metric: str, *, points: int = 1000, since: float | None = None,
                   until: float | None = None) -> Json:
        body: Json = self.get_json(job_path(job_id, "timeseries"), metric=metric, points=points, since=since,
                                   until=until)
        return body

    def timeseries_batch(self, job_id: str, points: Mapping[str, int], *, since: float | None = None,
                         until: float | None = None) -> dict[str, Json]:
        """Several metrics at once, each with its points budget (the API reads each GPU's samples once for all):
        {metric: the /timeseries answer for it}."""
        body: dict[str, Json] = self.get_json(job_path(job_id, "timeseries", "batch"), metric=list(points),
                                              points=list(points.values()), since=since, until=until)["metrics"]
        return body

    def steps(self, job_id: str, *, since: float | None = None, until: float | None = None,
              limit: int = 20_000, points: int | None = None) -> Json:
        """Per-step series; with `points`, downsampled per rank to about that many rows plus a step-time
        histogram of every step in the range (`wall_s_histogram`)."""
        body: Json = self.get_json(job_path(job_id, "steps"), since=since, until=until, limit=limit, points=points)
        return body

    def offset_plan(self, job_id: str) -> Json:
        """The offset plan of the job's allocation trace, column-wise: every allocation's `offset_bytes` in one
        arena of `arena_bytes` (ApiError 404 when no allocation trace was uploaded)."""
        body: Json = self.get_json(job_path(job_id, "plans", "offsets"))
        return body

    def swap_plan(self, job_id: str) -> Json:
        """The swap plan of the job's allocation trace, column-wise: each swapped allocation's offload and
        prefetch times, s from the trace window's start (ApiError 404 when no allocation trace was uploaded)."""
        body: Json = self.get_json(job_path(job_id, "plans", "swap"))
        return body

    def upload_trace(self, job_id: str, gzipped: bytes, *, filename: str, rank: int | None = None,
                     progress: Callable[[int], None] | None = None) -> Json:
        """POST /api/v1/jobs/{job_id}/traces: a gzip-compressed Kineto trace or snapshot JSON, sent as it is.
        The answer says its kind, rank and whether it was new (`created`)."""
        body: Json = self.request("POST", job_path(job_id, "traces"), raw_body=gzipped,
                                  content_type="application/gzip", params={"filename": filename, "rank": rank},
                                  compress=False, progress=progress).body
        return body

    def traces(self, job_id: str) -> list[Json]:
        """GET /api/v1/jobs/{job_id}/traces: the job's stored traces and snapshots (trace_id, kind, filename, rank,
        size_bytes, sha256, download_path, download_formats)."""
        body: Json = self.get_json(job_path(job_id, "traces"))
        traces: list[Json] = body["traces"]
        return traces

    def download_trace(self, job_id: str, trace_id: int, *, format: str | None = None) -> Download:
        """GET /api/v1/jobs/{job_id}/traces/{trace_id}: a Kineto trace as uploaded, a snapshot as torch's pickle
        (`format`: original, json, pickle; default by kind)."""
        return self.download(job_path(job_id, "traces", str(trace_id)), format=format)

    def download(self, path: str, **params: Any) -> Download:
        """A GET whose answer is a file: its bytes as sent, its content type and the name the server gave it."""
        try:
            resp = self._http.request("GET", self.server_url + path, headers=self._headers(),
                                      params=_present(params))
        except httpx.HTTPError as exc:
            raise ApiError(None, f"unreachable at {self.server_url}: {exc.__class__.__name__}: {exc}",
                           method="GET", path=path) from exc
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _detail(resp), method="GET", path=path,
                           retry_after_s=_retry_after_s(resp.headers.get("Retry-After")))
        return Download(resp.content, resp.headers.get("Content-Type", "").split(";")[0],
                        _attachment_name(resp.headers.get("Content-Disposition")))

    # ------------------------------------------------------------------------------------------ live captures
    def captures(self, job_id: str, *, state: str | None = None) -> list[Capture]:
        """GET /api/v1/jobs/{job_id}/captures: the job's captures, newest first (`state`: only those in it)."""
        from fleetprof.api_models import CaptureList

        return CaptureList.model_validate(self.get_json(job_path(job_id, "captures"), state=state)).captures

    def request_capture(self, job_id: str, *, kind: str = "kineto", steps: int = 5,
                        ranks: list[int] | None = None) -> Capture:
        """POST /api/v1/jobs/{job_id}/captures: ask the running job's hooks to capture `steps` steps (`kind`
        kineto or allocator) on `ranks` (None: every rank). The answer is the capture, `requested`."""
        from fleetprof.api_models import Capture

        return Capture.model_validate(self.post_json(job_path(job_id, "captures"),
                                                     {"kind": kind, "steps": steps, "ranks": ranks}))

    def capture_state(self, job_id: str, capture_id: str, state: str | None = None, *, reason: str | None = None,
                      rank: int | None = None) -> Capture:
        """A capture: as it is (`state` None), or after reporting `state` (delivered, capturing, or failed with
        `reason`), as the hooks do."""
        if state is None:
            found = [c for c in self.captures(job_id) if c.capture_id == capture_id]
            if not found:
                raise ApiError(404, f"capture {capture_id!r} of job {job_id!r} not found", method="GET",
                               path=job_path(job_id, "captures"))
            return found[0]
        from fleetprof.api_models import Capture

        return Capture.model_validate(self.post_json(job_path(job_id, "captures", capture_id, "state"),
                                                     {"state": state, "reason": reason, "rank": rank}))

    # ------------------------------------------------------------------------------------------ ingest (agent)
    def ingest_samples(self, batch: Mapping[str, Any]) -> Json:
        """POST /api/v1/ingest/samples: one fleetprof.protocol.SampleBatch as JSON (stored once by agent and seq)."""
        body: Json = self.post_json(INGEST_SAMPLES_PATH, dict(batch))
        return body

    def ingest_events(self, batch: Mapping[str, Any]) -> Json:
        """POST /api/v1/ingest/events: one fleetprof.protocol.EventBatch as JSON."""
        body: Json = self.post_json(INGEST_EVENTS_PATH, dict(batch))
        return body

    # ------------------------------------------------------------------------------ inventory and fleet (operator)
    def nodes(self) -> list[Json]:
        body: list[Json] = self.get_json("/api/v1/nodes")
        return body

    def gpus(self, node: str | None = None) -> list[Json]:
        body: list[Json] = self.get_json("/api/v1/gpus", node=node)
        return body

    def gpu_gpm(self, node: str, window_s: float = 300.0) -> list[Json]:
        """GET /api/v1/gpus/gpm: each of the node's GPUs' NVML GPM means over the last `window_s` seconds."""
        body: list[Json] = self.get_json("/api/v1/gpus/gpm", node=node, window_s=window_s)
        return body

    def fleet_summary(self, window: str = "24h") -> Json:
        body: Json = self.get_json("/api/v1/fleet/summary", window=window)
        return body

    def fleet_timeline(self, window: str = "24h") -> Json:
        body: Json = self.get_json("/api/v1/fleet/timeline", window=window)
        return body

    def fleet_headroom(self, window: str = "24h") -> Json:
        body: Json = self.get_json("/api/v1/fleet/headroom", window=window)
        return body

    # ------------------------------------------------------------------------- estimator (scheduler, team, operator)
    def estimate(self, request: Mapping[str, Any], *, timeout_s: float | None = None) -> Json:
        """POST /api/v1/estimate: memory, the GPU types a model fits and its largest batch on each, time and energy
        per step, before it runs. `timeout_s` is the server-side limit (5..600 s; the server's default when None);
        this client waits for it. Raises EstimatorUnavailable where the API has no estimator."""
        try:
            # uncompressed: the request is a few hundred bytes
            body: Json = self.request("POST", ESTIMATE_PATH, json_body=dict(request), params={"timeout_s": timeout_s},
                                      compress=False,
                                      timeout_s=None if timeout_s is None else timeout_s + ESTIMATE_GRACE_S).body
            return body
        except ApiError as exc:
            if exc.status in (404, 405):
                raise EstimatorUnavailable(exc.status, "the estimator is not available on this API",
                                           method=exc.method, path=exc.path) from exc
            raise

    # ------------------------------------------------------------------------------------------------ who am I
    def scope(self) -> str:
        """'operator' or 'reader' (team/scheduler); raises ApiError(401) for a bad token."""
        try:
            self.get_json("/api/v1/nodes")
            return "operator"
        except ApiError as exc:
            if exc.status in (403, 404):
                self.get_json("/api/v1/jobs", limit=1)
                return "reader"
            raise
