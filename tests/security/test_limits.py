"""Per-token rate limits (429 + Retry-After) and request size limits (413), in-process and on a real server."""

from __future__ import annotations

import gzip

import httpx
import pytest
from fastapi.testclient import TestClient

from server.ratelimit import TokenBuckets
from tests.security.conftest import server_process
from tests.server.helpers import auth, sample_batch


def test_token_bucket_refills_at_the_configured_rate():
    now = [100.0]
    buckets = TokenBuckets(rate_per_s=2.0, burst=3, clock=lambda: now[0], max_keys=2)
    assert [buckets.take(b"a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take(b"a") == pytest.approx(0.5)      # empty: one token back in 1/rate
    assert buckets.take(b"b") == 0.0                      # another token has its own bucket
    now[0] += 0.5
    assert buckets.take(b"a") == 0.0
    now[0] += 100.0
    assert [buckets.take(b"a") for _ in range(4)][-1] > 0  # refills to the burst, never beyond
    buckets.take(b"c")                                     # past max_keys the least recently used is forgotten
    assert len(buckets._buckets) == 2


def _client(server_settings, **update):  # type: ignore[no-untyped-def]
    from server.app import create_app

    return TestClient(create_app(server_settings.model_copy(update=update)))


@pytest.fixture
def limited_api(server_settings):
    # a token comes back every 100 s: none within the test, however slow the machine (at 1/s, a request taking
    # over a third of a second on a loaded CI machine refilled one and the fourth request passed)
    with _client(server_settings, rate_limit_per_s=0.01, rate_limit_burst=3) as client:
        yield client


@pytest.fixture
def small_body_api(server_settings):
    with _client(server_settings, rate_limit_per_s=0.0, max_body_bytes=64 * 1024,
                 max_decompressed_bytes=1024 * 1024, max_trace_upload_bytes=256 * 1024) as client:
        yield client


def _metric(client, name: str) -> float:  # type: ignore[no-untyped-def]
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_rate_limit_is_per_token_with_retry_after(limited_api, make_token):
    one, two = make_token("operator"), make_token("operator")
    before = _metric(limited_api, "fleetprof_rate_limited_total")
    codes = [limited_api.get("/api/v1/nodes", headers=auth(one)).status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
    r = limited_api.get("/api/v1/nodes", headers=auth(one))
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "rate limit" in r.json()["detail"]
    assert r.headers["x-content-type-options"] == "nosniff"  # the refusal still carries the security headers
    assert limited_api.get("/api/v1/nodes", headers=auth(two)).status_code == 200  # another token: its own bucket
    # Liveness, readiness and scrapes are never throttled, whatever token they carry.
    for path in ("/healthz", "/readyz", "/metrics") * 4:
        assert limited_api.get(path, headers=auth(one)).status_code == 200
    assert _metric(limited_api, "fleetprof_rate_limited_total") - before >= 3
    # Ingest refusals are counted by reason too.
    agent = make_token("agent", node="node-a")
    codes = [limited_api.post("/api/v1/ingest/samples", json=sample_batch(seq=i, n=1), headers=auth(agent)).status_code
             for i in range(5)]
    assert codes.count(429) == 2
    assert _metric(limited_api, 'fleetprof_ingest_rejected_total{reason="rate_limited"}') >= 2


def test_rate_limit_on_a_real_server_and_recovery(cli_env, make_token, tmp_path):
    token = make_token("scheduler")
    env = dict(cli_env, FLEETPROF_RATE_LIMIT_PER_S="2", FLEETPROF_RATE_LIMIT_BURST="5")
    with server_process(env, tmp_path / "server.log") as url, httpx.Client(base_url=url, headers=auth(token)) as c:
        codes = [c.get("/api/v1/jobs").status_code for _ in range(12)]
        assert codes[:5] == [200] * 5 and 429 in codes[5:]
        refused = c.get("/api/v1/jobs")
        wait_s = int(refused.headers["retry-after"])
        assert refused.status_code == 429 and 1 <= wait_s <= 2
        import time

        time.sleep(wait_s)
        assert c.get("/api/v1/jobs").status_code == 200  # honouring Retry-After is enough to get through


def test_bodies_over_the_limit_are_413_declared_or_streamed(small_body_api, make_token, server_settings):
    limited_api = small_body_api
    team, agent = make_token("team", team="alpha"), make_token("agent", node="node-a")
    big = {"job_id": "j1", "metadata": {"blob": "x" * (80 * 1024)}}
    r = limited_api.post("/api/v1/jobs", json=big, headers=auth(team))
    assert r.status_code == 413 and "limit" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(100):
            yield b" " * 1024

    r = limited_api.post("/api/v1/jobs", content=chunks(), headers={**auth(team), "Content-Type": "application/json"})
    assert r.status_code == 413
    # A zip bomb: small on the wire, huge once inflated.
    bomb = gzip.compress(b"{" + b" " * (4 * 1024 * 1024) + b"}")
    r = limited_api.post("/api/v1/ingest/samples", content=bomb,
                         headers={**auth(agent), "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 413
    # Trace uploads have their own, larger limit; nothing is left behind in the blob directory.
    r = limited_api.post("/api/v1/jobs/j1/traces", content=b"\x1f\x8b" + b"0" * (300 * 1024), headers=auth(team))
    assert r.status_code == 413
    r = limited_api.post("/api/v1/jobs/j1/traces", content=(b"0" * 1024 for _ in range(300)), headers=auth(team))
    assert r.status_code == 413
    assert [p for p in server_settings.blob_dir.rglob("*") if p.is_file()] == []
    # Under the limit, the same routes work.
    assert limited_api.post("/api/v1/jobs", json={"job_id": "j1"}, headers=auth(team)).status_code == 200


def test_oversized_chunked_body_on_a_real_server(cli_env, make_token, tmp_path):
    team = make_token("team", team="alpha")
    env = dict(cli_env, FLEETPROF_MAX_BODY_BYTES="65536")
    with server_process(env, tmp_path / "server.log") as url:
        r = httpx.post(url + "/api/v1/jobs", content=(b" " * 4096 for _ in range(64)),
                       headers={**auth(team), "Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413
        r = httpx.post(url + "/api/v1/jobs", content=b" " * 100_000,
                       headers={**auth(team), "Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413
        assert httpx.get(url + "/healthz").status_code == 200
