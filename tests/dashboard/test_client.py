"""The REST client's error mapping (httpx MockTransport: no network)."""

from __future__ import annotations

import httpx
import pytest

from dashboard.client import ApiClient, ApiError, EstimatorUnavailable


def _client(handler) -> ApiClient:  # type: ignore[no-untyped-def]
    return ApiClient("http://api", "tok", transport=httpx.MockTransport(handler))


def test_estimate_404_means_estimator_unavailable() -> None:
    with _client(lambda r: httpx.Response(404, json={"detail": "Not Found"})) as c, \
            pytest.raises(EstimatorUnavailable):
        c.estimate({"batch_size": 1})


def test_errors_carry_status_and_detail_and_params_are_clean() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(422, json={"detail": [{"loc": ["query", "since"], "msg": "bad"}]})

    with _client(handler) as c, pytest.raises(ApiError) as err:
        c.jobs(team=None, q="", state="running")
    assert err.value.status == 422 and "query.since: bad" in err.value.detail
    assert seen["url"] == "http://api/api/v1/jobs?state=running&limit=50&offset=0"
    assert seen["auth"] == "Bearer tok"


def test_job_id_is_one_path_segment() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["path"] = request.url.raw_path
        return httpx.Response(200, json={})

    with _client(handler) as c:
        c.report("a/../b")
    assert seen["path"] == b"/api/v1/jobs/a%2F..%2Fb/report"


def test_html_report_asks_for_html() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        return httpx.Response(200, text="<!doctype html><html></html>")

    with _client(handler) as c:
        assert c.report_html("j 1").startswith("<!doctype html>")
    assert seen["url"] == "http://api/api/v1/jobs/j%201/report?format=html"


def test_gather_runs_calls_at_once_and_returns_api_errors_in_place() -> None:
    import threading

    from dashboard.client import gather

    barrier = threading.Barrier(3, timeout=5)  # all three must be in flight together

    def ok(value: int):  # type: ignore[no-untyped-def]
        def call() -> int:
            barrier.wait()
            return value
        return call

    def refused() -> int:
        barrier.wait()
        raise ApiError(404, "no")

    first, error, last = gather(ok(1), refused, ok(3))
    assert (first, last) == (1, 3) and isinstance(error, ApiError) and error.status == 404


def test_unreachable_api_is_status_0() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with _client(handler) as c, pytest.raises(ApiError) as err:
        c.nodes()
    assert err.value.status == 0


def test_dashboard_sends_security_headers_and_no_cors() -> None:
    from dashboard.app import create_dash_app

    app = create_dash_app("http://127.0.0.1:9", token=None)  # no API needed to serve the shell
    r = app.server.test_client().get("/", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200
    assert r.headers["X-Frame-Options"] == "DENY" and r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "no-referrer"
    assert "Access-Control-Allow-Origin" not in r.headers
    assert r.headers["Cache-Control"] == "no-store"  # pages and callback answers are never stored
    code = app.server.test_client().get("/_dash-component-suites/plotly/package_data/plotly.min.js")
    assert code.status_code == 200 and code.headers["Cache-Control"] == "no-cache"  # revalidated, not re-sent
    assert code.headers["X-Content-Type-Options"] == "nosniff" and code.headers.get("ETag")
