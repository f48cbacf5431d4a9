"""API conventions (issue 16.5): the bearer security scheme, readable operationIds, one problem-details shape for
every error, and gzip request bodies on every route."""

from __future__ import annotations

import gzip
import re
from collections import Counter
from http import HTTPStatus
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from fleetprof.client import Client
from server.app import create_app
from server.ingest.router import InflightLimiter
from tests.server.helpers import auth, sample_batch

SAMPLES = "/api/v1/ingest/samples"
JOBS = "/api/v1/jobs"


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in spec["paths"].items() for m, op in item.items()]


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    """RFC 9457 problem details, with the `detail` key clients read and `retry_after_s` beside a Retry-After."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["type"].startswith("urn:fleetprof:problem:") and body["status"] == status, body
    assert body["title"] == HTTPStatus(status).phrase and body["detail"], body
    if "retry-after" in r.headers:
        assert body["retry_after_s"] == int(r.headers["retry-after"]) >= 1, body
    assert set(body) <= {"type", "title", "status", "detail", "errors", "retry_after_s"}, body
    return body


def test_openapi_has_the_bearer_scheme_readable_operation_ids_and_problem_responses():
    spec = create_app().openapi()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "fp_…",
        "description": "A token from `fleetprof token create`, sent as `Authorization: Bearer <token>`."}
    ops = _operations(spec)
    assert len(ops) >= 20
    for method, path, op in ops:
        public = not path.startswith("/api/")
        assert op.get("security") == (None if public else [{"bearer": []}]), (method, path)
        assert not [p for p in op.get("parameters", []) if p["name"].lower() == "authorization"], (method, path)
        assert re.fullmatch(r"[a-z]+-[a-z_]+", op["operationId"]), op["operationId"]
        assert not re.search(r"_api_v1_|_(get|post)$", op["operationId"]), op["operationId"]
        if not public:
            for status in ("401", "403", "404", "422", "429"):
                assert op["responses"][status]["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}, (path, status)
        errors = [r for s, r in op["responses"].items() if s[0] in "45"]
        assert public or all("application/problem+json" in r["content"] for r in errors), (method, path)
    ids = Counter(op["operationId"] for _, _, op in ops)
    assert [i for i, n in ids.items() if n > 1] == []
    assert ids["jobs-get_report"] == ids["ingest-ingest_samples"] == 1
    assert set(spec["components"]["schemas"]["Problem"]["required"]) == {"type", "title", "status", "detail"}


def test_bearer_header_as_clients_send_it(api, make_token):
    token = make_token("operator")
    assert api.get("/api/v1/nodes", headers=auth(token)).status_code == 200
    assert api.get("/api/v1/nodes", headers={"Authorization": f"bearer {token}"}).status_code == 200
    for headers in ({}, {"Authorization": token}, {"Authorization": "Bearer "}, auth(token + "x")):
        r = api.get("/api/v1/nodes", headers=headers)
        assert_problem(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.fixture
def small_api(server_settings):
    settings = server_settings.model_copy(update={"rate_limit_per_s": 0.5, "rate_limit_burst": 20,
                                                  "max_body_bytes": 64 * 1024, "max_decompressed_bytes": 256 * 1024})
    with TestClient(create_app(settings)) as client:
        yield client


def test_every_kind_of_error_has_the_problem_shape(small_api, make_token):
    api = small_api
    operator, team = auth(make_token("operator")), auth(make_token("team", team="vision"))
    agent = auth(make_token("agent", node="node-a"))
    assert_problem(api.get("/api/v1/nodes"), 401)                                          # no token
    assert_problem(api.get("/api/v1/nodes", headers=team), 403)                            # scope
    assert "not found" in assert_problem(api.get(JOBS + "/nope", headers=operator), 404)["detail"]
    assert_problem(api.get("/api/v1/no-such-route", headers=operator), 404)                # routing
    r = api.delete(JOBS, headers=operator)
    assert_problem(r, 405)
    assert r.headers["allow"]
    body = assert_problem(api.get(JOBS, params={"since": "soon"}, headers=operator), 422)  # request validation
    assert body["detail"] == body["errors"] and body["detail"][0]["loc"] == ["query", "since"]
    assert body["type"].endswith(":validation-error")
    assert_problem(api.post(JOBS, content=b"{", headers={**team, "Content-Type": "application/json"}), 422)
    assert_problem(api.post(JOBS, json={"job_id": "a b"}, headers=team), 422)
    # Bodies: over the limit as sent, inflated past the limit (a bomb), not gzip, another encoding.
    assert_problem(api.post(JOBS, content=b"x" * (65 * 1024), headers=team), 413)
    bomb = gzip.compress(b" " * (300 * 1024))
    for path, who in ((JOBS, team), (SAMPLES, agent)):
        gz = {**who, "Content-Type": "application/json", "Content-Encoding": "gzip"}
        assert "decompressed" in assert_problem(api.post(path, content=bomb, headers=gz), 413)["detail"]
        assert "gzip" in assert_problem(api.post(path, content=b"not gzip at all", headers=gz), 422)["detail"]
        assert_problem(api.post(path, content=gzip.compress(b'{"job_id": "x"}')[:-6], headers=gz), 422)
        assert_problem(api.post(path, content=b"{}", headers={**gz, "Content-Encoding": "br"}), 415)
    # The ingest fast path, shedding load: 503 + Retry-After.
    api.app.state.ingest_limiter = InflightLimiter(0)
    r = api.post(SAMPLES, json=sample_batch(), headers=agent)
    assert assert_problem(r, 503)["type"].endswith(":overloaded") and r.headers["retry-after"] == "2"
    # The request guard: 429 + Retry-After once the token's burst is spent.
    for _ in range(25):
        r = api.get(JOBS, headers=operator)
        if r.status_code == 429:
            break
    assert assert_problem(r, 429)["type"].endswith(":rate-limited")


def test_gzip_bodies_reach_every_route_through_the_real_transport(live_server, make_token):
    """The client transport gzips any body of 1 KiB or more: registering a job with 10 KB of metadata was a 400."""
    token = make_token("team", team="vision")
    metadata = {"notes": "x" * 10_000, "layers": list(range(200))}
    with Client(live_server, token) as t:
        t.request("POST", JOBS, json_body={"job_id": "gz-1", "team": "vision", "metadata": metadata})
        job = t.get_json(JOBS + "/gz-1")
    assert job["metadata"] == metadata
    headers = {**auth(token), "Content-Type": "application/json", "Content-Encoding": "gzip"}
    # 128 MiB of spaces is 128 KiB of gzip: refused as it passes the limit, not inflated whole.
    bomb = gzip.compress(b" " * (129 * 2**20), compresslevel=1)
    r = httpx.post(live_server + JOBS, content=bomb, headers=headers, timeout=30)
    assert "decompressed" in assert_problem(r, 413)["detail"]
    r = httpx.post(live_server + JOBS, content=gzip.compress(b'{"job_id": "gz-1", "name": "n"}'), headers=headers)
    assert r.status_code == 200 and r.json()["name"] == "n" and r.json()["metadata"] == metadata
    # The inflated requests are still counted under their route (the middleware edits the scope in place).
    metrics = httpx.get(live_server + "/metrics", timeout=30).text
    counted = re.findall(r'fleetprof_http_request_duration_seconds_count\{route="/api/v1/jobs",status="(\d+)"\} (\S+)',
                         metrics)
    by_status = {status: float(n) for status, n in counted}
    assert by_status.get("200", 0) >= 2 and sum(by_status.values()) >= 3, metrics[:2000]
