"""The REST client's requests and error mapping (httpx MockTransport: no network)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from fleetprof.client import ApiError, Client, EstimatorUnavailable, retry_delay_s
from fleetprof.errors import ExitCode, exit_code_for_status

Handler = Callable[[httpx.Request], httpx.Response]


def _client(handler: Handler, token: str | None = "tok") -> Client:
    return Client("http://api/", token, transport=httpx.MockTransport(handler))


def _answer(status: int, **kwargs: object) -> Handler:
    return lambda request: httpx.Response(status, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "exit_code"), [(401, ExitCode.AUTH), (403, ExitCode.AUTH),
                                                  (404, ExitCode.NOT_FOUND), (422, ExitCode.REJECTED),
                                                  (503, ExitCode.UNAVAILABLE)])
def test_an_error_answer_carries_status_detail_and_where(status: int, exit_code: ExitCode) -> None:
    # RFC 9457 problem details, as server/errors.py writes them
    problem = {"type": "about:blank", "title": "x", "status": status, "detail": f"the reason {status}"}
    with _client(_answer(status, json=problem, headers={"Content-Type": "application/problem+json"})) as c, \
            pytest.raises(ApiError) as err:
        c.job("j1")
    exc = err.value
    assert (exc.status, exc.detail, exc.method, exc.path) == (status, f"the reason {status}", "GET", "/api/v1/jobs/j1")
    assert str(exc) == f"GET /api/v1/jobs/j1 -> HTTP {status}: the reason {status}"
    assert exc.retryable is (status >= 500) and not exc.unreachable
    assert exit_code_for_status(exc.status) is exit_code


def test_429_reads_retry_after_in_seconds_and_as_a_date() -> None:
    with _client(_answer(429, json={"detail": "slow down"}, headers={"Retry-After": "7"})) as c, \
            pytest.raises(ApiError) as err:
        c.jobs()
    assert err.value.status == 429 and err.value.retry_after_s == 7.0 and err.value.retryable
    assert retry_delay_s(err.value, 1, rng=lambda: 0.0) == 7.0
    assert retry_delay_s(err.value, 1, rng=lambda: 1.0) == pytest.approx(7.7)  # at most 10 % jitter

    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    with _client(_answer(503, text="busy", headers={"Retry-After": later})) as c, pytest.raises(ApiError) as err:
        c.jobs()
    assert err.value.retry_after_s is not None and 110 < err.value.retry_after_s <= 120
    assert err.value.detail == "busy"  # not JSON: the body's text


def test_without_retry_after_the_delay_backs_off_exponentially_to_its_cap() -> None:
    exc = ApiError(None, "down")
    ceilings = [retry_delay_s(exc, n, base_s=0.5, max_s=10.0, rng=lambda: 1.0) for n in (1, 2, 3, 10)]
    assert ceilings == [1.0, 2.0, 4.0, 10.0]
    assert retry_delay_s(exc, 3, base_s=0.5, max_s=10.0, rng=lambda: 0.0) == 2.0  # half of it random


def test_unreachable_is_status_none_and_worth_retrying() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with _client(refuse) as c, pytest.raises(ApiError) as err:
        c.nodes()
    assert err.value.status is None and err.value.unreachable and err.value.retryable
    assert "unreachable at http://api" in str(err.value) and "ConnectError" in str(err.value)
    assert exit_code_for_status(err.value.status) is ExitCode.UNAVAILABLE


def test_request_retrying_gives_up_on_a_final_refusal_and_retries_the_rest() -> None:
    statuses = iter([503, 429, 200])
    sleeps: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(statuses)
        return httpx.Response(status, json={"detail": "x"} if status >= 400 else {"ok": True},
                              headers={"Retry-After": "0"} if status == 429 else {})

    with _client(handler) as c:
        assert c.request_retrying("GET", "/x", give_up_after_s=60, sleep=sleeps.append).body == {"ok": True}
    assert len(sleeps) == 2
    with _client(_answer(422, json={"detail": "bad"})) as c, pytest.raises(ApiError) as err:
        c.request_retrying("GET", "/x", give_up_after_s=60, sleep=sleeps.append)
    assert err.value.status == 422 and len(sleeps) == 2  # not retried


def test_validation_errors_are_joined_and_unset_params_left_out() -> None:
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


def test_no_token_sends_no_authorization() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, json={"jobs": []})

    with _client(handler, token=None) as c:
        c.jobs()
    assert seen["auth"] is None


def test_estimate_404_means_estimator_unavailable() -> None:
    with _client(_answer(404, json={"detail": "Not Found"})) as c, pytest.raises(EstimatorUnavailable) as err:
        c.estimate({"batch_size": 1})
    assert isinstance(err.value, ApiError) and err.value.status == 404


def test_estimate_sends_its_server_side_limit() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        seen["body"] = json.loads(request.content)
        return httpx.Response(200, json={"model_name": "m"})

    with _client(handler) as c:
        assert c.estimate({"batch_size": 2}, timeout_s=45) == {"model_name": "m"}
    assert seen == {"url": "http://api/api/v1/estimate?timeout_s=45", "body": {"batch_size": 2}}


def test_job_id_is_one_path_segment() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["path"] = request.url.raw_path
        return httpx.Response(200, json={})

    with _client(handler) as c:
        c.report_json("a/../b")
    assert seen["path"] == b"/api/v1/jobs/a%2F..%2Fb/report"


def test_html_report_asks_for_html() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        return httpx.Response(200, text="<!doctype html><html></html>")

    with _client(handler) as c:
        assert c.report_html("j 1").startswith("<!doctype html>")
    assert seen["url"] == "http://api/api/v1/jobs/j%201/report?format=html"


def test_rightsizing_by_job_or_by_name() -> None:
    urls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return httpx.Response(200, json={})

    with _client(handler) as c:
        c.rightsizing("j1", history=5)
        c.rightsizing(name="nightly", team="vision")
        with pytest.raises(ValueError):
            c.rightsizing("j1", name="nightly")
        with pytest.raises(ValueError):
            c.rightsizing()
    assert urls == ["http://api/api/v1/jobs/j1/rightsizing?history=5",
                    "http://api/api/v1/rightsizing?name=nightly&team=vision&history=50"]


def test_a_large_json_body_goes_gzip_compressed_a_small_one_plain() -> None:
    bodies: list[tuple[str | None, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append((request.headers.get("content-encoding"), request.content))
        return httpx.Response(200, json={"ok": True})

    with _client(handler) as c:
        c.register_job({"job_id": "small"})
        c.register_job({"job_id": "large", "metadata": {"note": "x" * 4000}})
    (small_enc, small), (large_enc, large) = bodies
    assert small_enc is None and json.loads(small) == {"job_id": "small"}
    assert large_enc == "gzip" and json.loads(gzip.decompress(large))["metadata"]["note"] == "x" * 4000


def test_a_long_detail_is_kept_whole_a_foreign_body_cut() -> None:
    advice = "x" * 400 + " (use --local)"
    with _client(_answer(422, json={"detail": advice})) as c, pytest.raises(ApiError) as err:
        c.jobs()
    assert err.value.detail == advice  # the server's advice may come last
    with _client(_answer(502, text="<html>" + "y" * 1000)) as c, pytest.raises(ApiError) as err:
        c.jobs()
    assert err.value.detail.startswith("<html>") and len(err.value.detail) == 300


def test_from_settings_names_what_is_unset() -> None:
    from fleetprof.settings import ClientSettings, ConnectionUnset

    with pytest.raises(ConnectionUnset, match="FLEETPROF_SERVER_URL") as err:
        Client.from_settings(ClientSettings(server_url=None, token="t"))
    assert err.value.option == "--server"
    with pytest.raises(ConnectionUnset, match="FLEETPROF_TOKEN"):
        Client.from_settings(ClientSettings(server_url="http://api", token=None))
    with Client.from_settings(ClientSettings(server_url="http://api/", token="t")) as c:
        assert (c.server_url, c.token) == ("http://api", "t")
