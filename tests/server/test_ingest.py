"""Ingest: valid batches are stored once; every kind of bad input gets a 4xx and changes nothing."""

from __future__ import annotations

import gzip
import json
import time

import pytest
from sqlalchemy import func, select

from server.models import GpuSample, IngestBatch, Node, ProcessSample
from tests.server.helpers import auth, gz, sample_batch

SAMPLES = "/api/v1/ingest/samples"


def _count(db_session, model=GpuSample) -> int:  # type: ignore[no-untyped-def]
    db_session.rollback()  # fresh snapshot
    return db_session.scalar(select(func.count()).select_from(model)) or 0


def test_batch_is_stored_after_ack_and_duplicates_store_once(api, make_token, db_session):
    token = make_token("agent", node="node-a")
    batch = sample_batch(n=10, gpus=8)
    r = api.post(SAMPLES, content=gz(batch), headers={**auth(token), "Content-Encoding": "gzip",
                                                      "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 80 and r.json()["duplicate"] is False
    assert _count(db_session) == 80
    again = api.post(SAMPLES, json=batch, headers=auth(token))
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert _count(db_session) == 80
    stored = db_session.execute(select(GpuSample.memory_used_bytes).order_by(GpuSample.memory_used_bytes)).scalars()
    assert sorted(stored) == sorted(batch["samples"]["memory_used_bytes"])


def test_resent_samples_under_a_new_seq_are_not_duplicated(api, make_token, db_session):
    token = make_token("agent", node="node-a")
    t0 = time.time() - 100
    assert api.post(SAMPLES, json=sample_batch(seq=0, t0=t0), headers=auth(token)).status_code == 200
    # acknowledged (they are durable), but stored once: the (gpu, ts) key de-duplicates
    r = api.post(SAMPLES, json=sample_batch(seq=1, t0=t0), headers=auth(token))
    assert r.status_code == 200 and r.json()["duplicate"] is False
    assert _count(db_session) == 20


def test_process_rows_attribute_gpus_to_jobs(api, make_token, db_session):
    token = make_token("agent", node="node-a")
    op = make_token("operator")
    batch = sample_batch(n=3, gpus=1)
    batch["processes"] = {"ts": batch["samples"]["ts"], "gpu_uuid": batch["samples"]["gpu_uuid"],
                          "pid": [4242] * 3, "used_memory_bytes": [2**30] * 3, "job_id": ["slurm-77"] * 3,
                          "attribution": ["env:SLURM_JOB_ID"] * 3}
    assert api.post(SAMPLES, json=batch, headers=auth(token)).status_code == 200
    assert _count(db_session, ProcessSample) == 3
    job = api.get("/api/v1/jobs/slurm-77", headers=auth(op)).json()
    assert job["gpu_uuids"] == ["GPU-node-a-0"] and job["state"] == "running"


BAD_INPUTS = {
    "malformed json": (b'{"protocol_version": 1, "node": ', {}, 422, "malformed JSON"),
    "nan literal": (json.dumps(sample_batch()).replace('"power_w": [100.0', '"power_w": [NaN').encode(), {}, 422,
                    "malformed JSON"),
    "nan string": (None, {"power_w": "NaN"}, 422, "power_w"),
    "infinity string": (None, {"power_w": "Infinity"}, 422, "power_w"),
    "negative memory": (None, {"memory_used_bytes": -5}, 422, "memory_used_bytes"),
    "utilization over 100": (None, {"gpu_util_pct": 180.0}, 422, "gpu_util_pct"),
    "unknown protocol version": (None, {"protocol_version": 2}, 422, "protocol_version"),
    "column length mismatch": (None, {"drop_one": True}, 422, "ts has"),
    "timestamp in the far future": (None, {"future": True}, 422, "future"),
    "timestamp before 2000": (None, {"ts": 12.0}, 422, "ts"),
    "unknown gpu": (None, {"unknown_gpu": True}, 422, "has not reported"),
    "unknown field": (None, {"extra_top": True}, 422, "Extra inputs"),
    "empty body": (b"", {}, 422, "empty request body"),
    "truncated gzip": (gz(sample_batch())[:40], {"gzip": True}, 422, "truncated"),
    "not gzip": (b"hello", {"gzip": True}, 422, "gzip"),
}


def _bad_body(raw: bytes | None, mutate: dict) -> bytes:  # type: ignore[type-arg]
    if raw is not None:
        return raw
    batch = sample_batch(seq=99)
    s = batch["samples"]
    for key in ("power_w", "memory_used_bytes", "gpu_util_pct"):
        if key in mutate:
            s[key][3] = mutate[key]
    if "protocol_version" in mutate:
        batch["protocol_version"] = mutate["protocol_version"]
    if "ts" in mutate:
        s["ts"][0] = mutate["ts"]
    if mutate.get("drop_one"):
        s["power_w"].pop()
    if mutate.get("future"):
        s["ts"][-1] = time.time() + 10 * 86400
    if mutate.get("unknown_gpu"):
        s["gpu_uuid"][0] = "GPU-not-in-inventory"
    if mutate.get("extra_top"):
        batch["surprise"] = 1
    return json.dumps(batch).encode()


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_4xx_and_loses_nothing(api, make_token, db_session, case):
    token = make_token("agent", node="node-a")
    assert api.post(SAMPLES, json=sample_batch(seq=1), headers=auth(token)).status_code == 200
    before = _count(db_session)
    raw, mutate, status, message = BAD_INPUTS[case]
    headers = {**auth(token), "Content-Type": "application/json"}
    if mutate.get("gzip"):
        headers["Content-Encoding"] = "gzip"
    r = api.post(SAMPLES, content=_bad_body(raw, mutate), headers=headers)
    assert r.status_code == status, r.text
    assert message.lower() in json.dumps(r.json()).lower()
    assert _count(db_session) == before
    assert _count(db_session, IngestBatch) == 1  # the rejected batch was not recorded as seen


def test_body_over_the_limit_is_413(api, make_token, server_settings, db_session):
    token = make_token("agent", node="node-a")
    huge = b"x" * (server_settings.max_body_bytes + 1)
    r = api.post(SAMPLES, content=huge, headers={**auth(token), "Content-Type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["detail"]
    bomb = gzip.compress(b" " * (server_settings.max_decompressed_bytes + 10))
    r = api.post(SAMPLES, content=bomb, headers={**auth(token), "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]
    assert _count(db_session) == 0


def test_authentication_and_node_scope(api, make_token, db_session):
    batch = sample_batch()
    assert api.post(SAMPLES, json=batch).status_code == 401
    r = api.post(SAMPLES, json=batch, headers=auth("fp_not-a-real-token"))
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    other_node = make_token("agent", node="node-b")
    r = api.post(SAMPLES, json=batch, headers=auth(other_node))
    assert r.status_code == 403 and "node-b" in r.json()["detail"]
    team = make_token("team", team="vision")
    assert api.post(SAMPLES, json=batch, headers=auth(team)).status_code == 403
    assert _count(db_session) == 0
    assert _count(db_session, Node) == 0


def test_inventory_is_recorded(api, make_token):
    token = make_token("agent", node="node-a")
    batch = sample_batch(gpus=2, node_info={"hostname": "gpu01", "driver_version": "590.48.01",
                                            "cuda_version": "13.1", "nvml_version": "590.48"},
                         dropped_samples_total=7)
    assert api.post(SAMPLES, json=batch, headers=auth(token)).status_code == 200
    op = make_token("operator")
    nodes = api.get("/api/v1/nodes", headers=auth(op)).json()
    assert nodes[0]["name"] == "node-a" and nodes[0]["driver_version"] == "590.48.01"
    assert nodes[0]["gpu_count"] == 2 and nodes[0]["dropped_samples_total"] == 7
    gpus = api.get("/api/v1/gpus", headers=auth(op)).json()
    assert [g["uuid"] for g in gpus] == ["GPU-node-a-0", "GPU-node-a-1"]
    assert api.get("/api/v1/gpus", headers=auth(token)).status_code == 403
