"""Bad input gets a clear 4xx and loses nothing already accepted (issue 15, items 4 and 7): the 500s and loose ends
a probe of a running stack found, each kept fixed here."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.security.conftest import server_process
from tests.server.helpers import auth, sample_batch

KINETO = (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
          b'"ts": 1000, "dur": 50, "args": {"device": 0, "stream": 7}}]}')
NOT_TIMES = ["nan", "NaN", "inf", "-inf", "Infinity", "1e20", "-1", "1e308"]


def _blobs(settings) -> list[str]:  # type: ignore[no-untyped-def]
    root = settings.blob_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_oversized_chunked_sample_batch_is_413_on_a_real_server(cli_env, make_token, tmp_path):
    """No Content-Length: the guard counts the stream; the ingest fast path answered that with a 500."""
    agent = make_token("agent", node="node-a")
    log_path = tmp_path / "server.log"
    with server_process(dict(cli_env, FLEETPROF_MAX_BODY_BYTES="65536"), log_path) as url:
        r = httpx.post(url + "/api/v1/ingest/samples", content=(b" " * 4096 for _ in range(64)),
                       headers={**auth(agent), "Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "limit" in r.json()["detail"]
        ok = httpx.post(url + "/api/v1/ingest/samples", json=sample_batch(node="node-a", n=2), headers=auth(agent),
                        timeout=30)
        assert ok.status_code == 200 and ok.json()["accepted"] == 4  # the collector carries on
    assert "Traceback" not in log_path.read_text()


@pytest.mark.parametrize("path", ["/timeseries?metric=power_w", "/timeseries/batch?metric=power_w", "/steps", ""])
def test_non_finite_or_absurd_times_are_422(api, make_token, path):
    """since/until of nan, inf or 1e20 went on to datetime arithmetic: 500 (OverflowError, ValueError)."""
    operator, agent = make_token("operator"), make_token("agent", node="node-a")
    t0 = time.time() - 600
    assert api.post("/api/v1/ingest/samples", json=sample_batch(node="node-a", n=30, t0=t0),
                    headers=auth(agent)).status_code == 200
    assert api.post("/api/v1/jobs", json={"job_id": "j1", "team": "alpha", "node": "node-a", "started_at": t0,
                                          "gpu_uuids": ["GPU-node-a-0"]}, headers=auth(operator)).status_code == 200
    base = f"/api/v1/jobs/j1{path}" if path else "/api/v1/jobs"
    sep = "&" if "?" in base else "?"
    for value in NOT_TIMES:
        for name in ("since", "until"):
            r = api.get(f"{base}{sep}{name}={value}", headers=auth(operator))
            assert r.status_code == 422, (path, name, value, r.status_code, r.text[:200])
            assert name in r.text
    assert api.get(f"{base}{sep}since={t0 - 60}", headers=auth(operator)).status_code == 200
    assert api.get(f"{base}{sep}since=0&until=1e11", headers=auth(operator)).status_code == 200  # the widest valid


@pytest.mark.parametrize("bad", ["300", True, False, "1.5", [1]])
def test_sample_values_are_numbers_not_strings_or_booleans(api, make_token, bad):
    agent = make_token("agent", node="node-a")
    for field in ("memory_used_bytes", "power_w", "gpu_util_pct"):
        batch = sample_batch(node="node-a", n=1, gpus=1)
        batch["samples"][field] = [bad]
        r = api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent))
        assert r.status_code == 422 and field in r.json()["detail"], (field, bad, r.text)
    batch = sample_batch(node="node-a", n=1, gpus=1)
    batch["samples"]["ts"] = [str(batch["samples"]["ts"][0])]
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 422
    # Integers are fine where a float is expected (JSON writes 100.0 as 100 in many encoders).
    batch = sample_batch(node="node-a", n=1, gpus=1)
    batch["samples"]["power_w"] = [100]
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200


def test_event_numbers_are_strict_too(api, make_token):
    team = make_token("team", team="alpha")
    assert api.post("/api/v1/jobs", json={"job_id": "j1"}, headers=auth(team)).status_code == 200
    step = {"kind": "step", "job_id": "j1", "ts": time.time(), "step": 1, "wall_s": 0.5}
    for field, bad in (("step", "1"), ("step", True), ("wall_s", "0.5"), ("wall_s", True)):
        batch = {"protocol_version": 1, "source_id": "s", "seq": 0, "sent_at": time.time(),
                 "events": [{**step, field: bad}]}
        r = api.post("/api/v1/ingest/events", json=batch, headers=auth(team))
        assert r.status_code == 422, (field, bad, r.text)


@pytest.mark.parametrize("body", [b'{"traceEvents": 5}', b'{"traceEvents": "x"}', b'{"traceEvents": {"a": 1}}',
                                  b'{"traceEvents": null}'])
def test_trace_events_must_be_a_list(api, make_token, server_settings, body):
    team = make_token("team", team="alpha")
    r = api.post("/api/v1/jobs/j1/traces", content=body, headers=auth(team))
    assert r.status_code == 422 and "traceEvents" in r.json()["detail"], r.text
    assert _blobs(server_settings) == []
    assert api.post("/api/v1/jobs/j1/traces", content=b'{"traceEvents": []}', headers=auth(team)).status_code == 200


def test_a_failed_trace_upload_leaves_no_blob(api, make_token, server_settings):
    """The blob was moved into place before the row was written: a refused row left a file no row names."""
    team = make_token("team", team="alpha")
    r = api.post("/api/v1/jobs/j1/traces", params={"filename": "a\x00b.json"}, content=KINETO, headers=auth(team))
    assert r.status_code == 422, r.text
    assert _blobs(server_settings) == []
    r = api.post("/api/v1/jobs/j1/traces", params={"filename": "ok.json"}, content=KINETO, headers=auth(team))
    assert r.status_code == 200 and r.json()["created"] is True
    assert len(_blobs(server_settings)) == 1
    # The same bytes again with a bad name: the stored blob (named by the same hash) must survive.
    r = api.post("/api/v1/jobs/j1/traces", params={"filename": "a\x00b.json", "rank": 3}, content=KINETO,
                 headers=auth(team))
    assert r.status_code in (200, 422)
    assert len(_blobs(server_settings)) == 1


def test_deeply_nested_json_is_422_like_any_malformed_body(api, make_token):
    team = make_token("team", team="alpha")
    deep = b'{"job_id": "j1", "metadata": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001
    for path in ("/api/v1/jobs", "/api/v1/ingest/events", "/api/v1/ingest/samples"):
        r = api.post(path, content=deep, headers={**auth(team), "Content-Type": "application/json"})
        assert r.status_code in (403, 422), (path, r.status_code)  # 403: a team token cannot ingest samples
    r = api.post("/api/v1/jobs", content=deep, headers={**auth(team), "Content-Type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.text
    r = api.post("/api/v1/jobs", content=b'{"job_id": ', headers={**auth(team), "Content-Type": "application/json"})
    assert r.status_code == 422
    json_type = {**auth(team), "Content-Type": "application/json"}
    r = api.post("/api/v1/jobs", content=b'{"job_id": "j\xff"}', headers=json_type)
    assert r.status_code == 422 and "UTF-8" in r.text  # bytes that are not UTF-8: FastAPI's 400 too


def test_job_metadata_is_capped(api, make_token):
    from server.jobs.schemas import MAX_METADATA_BYTES

    team = make_token("team", team="alpha")
    big = {"job_id": "j1", "metadata": {"blob": "x" * (15 * 1024 * 1024)}}
    r = api.post("/api/v1/jobs", content=json.dumps(big), headers={**auth(team), "Content-Type": "application/json"})
    assert r.status_code in (413, 422) and "metadata" in r.text and str(MAX_METADATA_BYTES) in r.text
    just_over = {"job_id": "j1", "metadata": {"blob": "x" * MAX_METADATA_BYTES}}
    assert api.post("/api/v1/jobs", json=just_over, headers=auth(team)).status_code == 422
    fits = {"job_id": "j1", "metadata": {"blob": "x" * (MAX_METADATA_BYTES - 100)}}
    assert api.post("/api/v1/jobs", json=fits, headers=auth(team)).status_code == 200
    assert api.get("/api/v1/jobs/j1", headers=auth(team)).json()["metadata"] == fits["metadata"]
    assert api.get("/api/v1/jobs", headers=auth(team)).json()["total"] == 1  # nothing else was stored


def test_scope_refusals_read_as_english(api, make_token):
    agent, team = make_token("agent", node="node-a"), make_token("team", team="alpha")
    for token in (agent, team):
        r = api.get("/api/v1/nodes", headers=auth(token))
        assert r.status_code == 403
        detail = r.json()["detail"]
        assert "(needs )" not in detail and "a agent" not in detail and "operator" in detail, detail
    r = api.post("/api/v1/ingest/samples", json=sample_batch(), headers=auth(team))
    assert r.status_code == 403 and r.json()["detail"] == "a team token cannot do this (needs an agent token)"
