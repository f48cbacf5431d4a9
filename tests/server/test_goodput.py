"""Fleet goodput and GPUs needing attention through the API, checked against a computation written here from the
samples sent (not from server.analysis.fleet.goodput)."""

from __future__ import annotations

import time

import pytest

from server.db import make_engine, make_sessionmaker, session_scope
from server.fleet.service import rollup_hours
from tests.server.helpers import auth, sample_batch

THERMAL, IDLE_BIT, POWER_CAP = 0x20, 0x1, 0x4


def _pattern(k: int, gpu: int) -> tuple[float, int]:
    """(utilization %, clock-event reasons) of GPU `gpu` at second k of the run."""
    if gpu == 0:
        if k < 300:
            return 0.0, IDLE_BIT  # a 5-minute idle start: idle
        if k % 60 < 10:
            return 0.0, IDLE_BIT  # 10-s gaps between bursts: input-stalled
        return 80.0, (THERMAL if 1800 <= k < 2400 else 0)  # 20 % of each busy second no kernel ran
    return 90.0, (IDLE_BIT if k % 2 else 0)  # busy; its idle bits are no slowdown


def _expected(n: int, gpu: int) -> dict[str, float]:
    """The definition in docs/ARCHITECTURE.md "Goodput", sample by sample, each sample standing for 1 s."""
    out = dict.fromkeys(("idle", "stalled", "throttled", "productive"), 0.0)
    low = [_pattern(k, gpu)[0] < 5 for k in range(n)]
    run_of = [0] * n  # the length of the run of low samples each belongs to
    k = 0
    while k < n:
        j = k
        while j < n and low[j]:
            j += 1
        for i in range(k, j):
            run_of[i] = j - k
        k = j + 1 if j == k else j
    for k in range(n):
        util, r = _pattern(k, gpu)
        if util < 5:
            out["idle" if run_of[k] >= 60 else "stalled"] += 1.0
        else:
            out["stalled"] += 1 - util / 100
            out["throttled" if r & (THERMAL | POWER_CAP) else "productive"] += util / 100
    return out


def test_goodput_and_gpus_needing_attention(api, make_token, server_settings):
    op, agent = make_token("operator"), make_token("agent", node="node-g")
    now = time.time()
    n = 3000
    t0 = now - n - 5
    for seq, lo in enumerate(range(0, n, 1000)):
        batch = sample_batch(node="node-g", agent_id="a-g", seq=seq, n=1000, gpus=2, t0=t0 + lo)
        s = batch["samples"]
        pats = [_pattern(int(round(ts - t0)), int(u.rsplit("-", 1)[1])) for ts, u in zip(s["ts"], s["gpu_uuid"])]
        s["gpu_util_pct"] = [p[0] for p in pats]
        s["throttle_reasons"] = [p[1] for p in pats]
        assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    # GPU 0 is team vision's job; GPU 1 is nlp's for its first 1000 s only (the rest is unallocated)
    for body in ({"job_id": "gp-v", "team": "vision", "gpu_uuids": ["GPU-node-g-0"], "started_at": t0,
                  "ended_at": t0 + n, "state": "finished", "node": "node-g"},
                 {"job_id": "gp-n", "team": "nlp", "gpu_uuids": ["GPU-node-g-1"], "started_at": t0,
                  "ended_at": t0 + 999, "state": "finished", "node": "node-g"}):
        assert api.post("/api/v1/jobs", json=body, headers=auth(op)).status_code == 200
    engine = make_engine(server_settings)
    with session_scope(make_sessionmaker(engine)) as session:
        rollup_hours(session, since=t0 - 3600, until=now, now=now)
    engine.dispose()

    body = api.get("/api/v1/fleet/summary", params={"window": "3h"}, headers=auth(op)).json()
    teams = {t["team"]: t for t in body["goodput_by_team"]}
    vision, nlp = _expected(n, 0), _expected(1000, 1)
    v = teams["vision"]
    assert v["allocated_gpu_hours"] == pytest.approx(n / 3600, rel=0.01)
    assert v["idle_gpu_hours"] == pytest.approx(vision["idle"] / 3600, rel=0.02)
    assert v["input_stalled_gpu_hours"] == pytest.approx(vision["stalled"] / 3600, rel=0.02)
    assert v["throttled_gpu_hours"] == pytest.approx(vision["throttled"] / 3600, rel=0.02)
    assert v["productive_gpu_hours"] == pytest.approx(vision["productive"] / 3600, rel=0.02)
    assert v["unknown_gpu_hours"] == pytest.approx(0.0, abs=1e-6)
    assert teams["nlp"]["throttled_gpu_hours"] == 0.0  # idle bits are not slowdowns
    assert teams["nlp"]["productive_gpu_hours"] == pytest.approx(nlp["productive"] / 3600, rel=0.02)
    fleet = body["goodput"]
    parts = ("idle", "input_stalled", "throttled", "productive", "unknown")
    assert sum(fleet[f"{p}_gpu_hours"] for p in parts) == pytest.approx(fleet["allocated_gpu_hours"], rel=1e-9)
    assert fleet["allocated_gpu_hours"] == pytest.approx((n + 1000) / 3600, rel=0.01)  # GPU 1's later time: no job

    attention = body["gpus_needing_attention"]
    assert [a["gpu_uuid"] for a in attention] == ["GPU-node-g-0"]
    (thermal,) = [f for f in attention[0]["findings"] if f["kind"] == "thermal"]
    assert thermal["seconds"] == pytest.approx(500, rel=0.02)  # 600 s less its ten 10-s gaps (idle bit only)
    assert attention[0]["node"] == "node-g" and attention[0]["gpu_index"] == 0

    gpus = api.get("/api/v1/gpus", params={"node": "node-g"}, headers=auth(op)).json()
    assert [[f["kind"] for f in g["findings"]] for g in gpus] == [["thermal"], []]
    assert all(g["findings"] is None for g in api.get("/api/v1/gpus", headers=auth(op)).json())
