"""The dashboard's `gather` and the headers its server sends (the REST client itself: tests/client)."""

from __future__ import annotations

from dashboard.client import ApiError


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
