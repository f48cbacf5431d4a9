"""Fleet rollups and summary through the API, checked against an independent computation."""

from __future__ import annotations

import time

import pytest

from server.db import make_engine, make_sessionmaker, session_scope
from server.fleet.service import rollup_hours
from tests.server.helpers import auth, sample_batch


def test_fleet_summary_matches_an_independent_computation(api, make_token, server_settings):
    op = make_token("operator")
    now = time.time()
    t0 = now - 3 * 3600
    t0 -= t0 % 3600  # three whole hours of 1 Hz samples, then one recent minute
    sent: dict[str, list[tuple[float, float, float]]] = {}
    for node, util_of in (("node-a", lambda k: 0.0 if k % 4 == 0 else 80.0), ("node-b", lambda k: 3.0)):
        agent = make_token("agent", node=node)
        for seq in range(11):
            batch = sample_batch(node=node, agent_id=f"a-{node}", seq=seq, n=1000, gpus=2, t0=t0 + 1000 * seq)
            s = batch["samples"]
            s["gpu_util_pct"] = [util_of(int(ts - t0)) for ts in s["ts"]]
            s["power_w"] = [200.0] * len(s["ts"])
            for ts, u, util, p in zip(s["ts"], s["gpu_uuid"], s["gpu_util_pct"], s["power_w"]):
                sent.setdefault(f"{node}/{u}", []).append((ts, util, p))
            # the most recent minute, so that "idle now" is known
            assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
        recent = sample_batch(node=node, agent_id=f"a-{node}", seq=99, n=60, gpus=2, t0=now - 60)
        recent["samples"]["gpu_util_pct"] = [util_of(1)] * len(recent["samples"]["ts"])
        assert api.post("/api/v1/ingest/samples", json=recent, headers=auth(agent)).status_code == 200
    engine = make_engine(server_settings)
    with session_scope(make_sessionmaker(engine)) as session:
        assert rollup_hours(session, since=t0, until=now) > 0
    engine.dispose()

    body = api.get("/api/v1/fleet/summary", params={"window": "6h"}, headers=auth(op)).json()
    # Independent: 1 Hz samples each stand for 1 s; busy = util >= 5 %; energy = power x time.
    covered = sum(len(v) for v in sent.values()) + 4 * 60
    busy = sum(1 for v in sent.values() for _, util, _ in v if util >= 5) + 2 * 60
    assert body["gpus_total"] == 4
    assert body["gpu_hours"] == pytest.approx(covered / 3600, rel=0.01)
    assert body["busy_gpu_hours"] == pytest.approx(busy / 3600, rel=0.01)
    assert body["idle_gpus_now"] == 2  # node-b's GPUs at 3 %
    assert body["energy_j"] == pytest.approx(sum(p for v in sent.values() for *_, p in v), rel=0.02)
    assert api.get("/api/v1/fleet/summary", params={"window": "soon"}, headers=auth(op)).status_code == 422
    assert api.get("/api/v1/fleet/summary", headers=auth(make_token("scheduler"))).status_code == 403
