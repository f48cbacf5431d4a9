"""Issue #20's joins, end to end: the NVML test double, scripted so one GPU's health counters rise mid-job
(tests/server/faulty_gpu.py), -> the agent's real NVML code and sampler -> the collector's ingest -> Postgres -> the
loader -> characterize -> the report's `health.findings`, `GET /api/v1/gpus?node=N` and the fleet summary's
`gpus_needing_attention`."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.auth.service import create_token
from server.config import ServerSettings
from server.db import make_engine, make_sessionmaker, session_scope
from server.fleet.service import rollup_hours
from server.migrate import upgrade
from tests.server import faulty_gpu as S  # the scenario's numbers
from tests.server.fake_node import poster
from tests.server.faulty_gpu import COUNTS, FLAGS, SOURCE, Shipped, ship_faulty_job
from tests.server.helpers import auth

NODE = "node-health"


@pytest.fixture
def shipped(api, make_token) -> tuple[str, Shipped]:  # type: ignore[no-untyped-def]
    post = poster(api)

    return ship_faulty_job(post, make_token, node=NODE, job_id="health-e2e")


def test_report_names_the_faulty_gpu_its_kinds_counts_and_since_times(api, shipped) -> None:  # type: ignore[no-untyped-def]
    op, truth = shipped
    health = api.get("/api/v1/jobs/health-e2e/report", headers=auth(op)).json()["health"]
    assert health["gpus_checked"] == 2 and health["gpus_with_findings"] == 1
    assert {f["gpu_uuid"] for f in health["findings"]} == {truth.bad}  # the clean GPU gets none
    by_kind = {f["kind"]: f for f in health["findings"]}
    assert set(by_kind) == set(COUNTS) | FLAGS | {"temperature_near_slowdown"}
    for kind, count in COUNTS.items():
        f = by_kind[kind]
        assert (f["count"], f["since_ts"], f["seconds"]) == (count, truth.seen_ts, None), f
    assert "double-bit" in by_kind["retired_pages"]["summary"]
    assert by_kind["ecc_uncorrected"]["severity"] == "critical"
    assert by_kind["ecc_uncorrected"]["source"] == "nvml:ecc volatile (ecc_uncorrected_volatile)" + SOURCE
    # a flag read every 30 s holds between its readings: raised from the reading that saw it to the job's end
    for kind in FLAGS:
        f = by_kind[kind]
        assert f["since_ts"] == truth.seen_ts and f["until_ts"] == truth.t0 + S.READINGS - 1, f
        assert f["seconds"] == pytest.approx(S.READINGS - (truth.seen_ts - truth.t0), abs=1.0), f
        assert f["fraction"] == pytest.approx(f["seconds"] / S.READINGS, abs=0.01)
    # the double's slowdown threshold (80 °C), not the catalogue's: the clean GPU, as hot, is under its own 90 °C
    hot = by_kind["temperature_near_slowdown"]
    assert hot["since_ts"] == truth.t0 + S.HOT_AT
    assert hot["seconds"] == pytest.approx(S.READINGS - S.HOT_AT, abs=1.0)
    assert hot["slowdown_temperature_c"] == S.SLOWDOWN_C and hot["temperature_max_c"] == S.SLOWDOWN_C - 3
    assert hot["slowdown_temperature_source"] == "nvml:temperature threshold SLOWDOWN" + SOURCE
    assert all(f["source"].endswith(SOURCE) for f in health["findings"])


def test_node_gpus_and_fleet_summary_list_the_faulty_gpu(api, shipped) -> None:  # type: ignore[no-untyped-def]
    op, truth = shipped
    gpus = {g["uuid"]: g for g in api.get("/api/v1/gpus", params={"node": NODE}, headers=auth(op)).json()}
    assert gpus[truth.good]["findings"] == []
    assert gpus[truth.bad]["slowdown_temperature_c"] == S.SLOWDOWN_C
    found = {f["kind"]: f for f in gpus[truth.bad]["findings"]}
    # the recent window reads each GPU's first and last health reading: counters as last - first, flags as last
    assert set(found) == set(COUNTS) | FLAGS
    assert {k: found[k]["count"] for k in COUNTS} == COUNTS
    assert all(f["source"].endswith(SOURCE) for f in found.values())

    summary = api.get("/api/v1/fleet/summary", params={"window": "1h"}, headers=auth(op)).json()
    attention = [a for a in summary["gpus_needing_attention"] if a["node"] == NODE]
    assert [(a["gpu_uuid"], a["gpu_index"], a["severity"]) for a in attention] == \
        [(truth.bad, S.FAULTY, "critical")]
    assert {f["kind"]: f.get("count") for f in attention[0]["findings"]} == {**COUNTS, **dict.fromkeys(FLAGS)}


def test_fleet_lists_the_gpu_running_near_its_slowdown_temperature_from_the_rollups(  # type: ignore[no-untyped-def]
        api, shipped, server_settings) -> None:
    """Rolled up, the seconds the faulty GPU ran within a few degrees of its own slowdown threshold (80 °C) reach the
    node's and the fleet's attention lists; the clean GPU, as hot but under its own 90 °C, is not listed."""
    op, truth = shipped
    now = time.time()
    engine = make_engine(server_settings)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            rollup_hours(session, since=truth.t0 - 3600, until=now, now=now)
    finally:
        engine.dispose()
    gpus = {g["uuid"]: g for g in api.get("/api/v1/gpus", params={"node": NODE}, headers=auth(op)).json()}
    assert gpus[truth.good]["findings"] == []
    hot = {f["kind"]: f for f in gpus[truth.bad]["findings"]}["temperature_near_slowdown"]
    assert hot["seconds"] == pytest.approx(S.READINGS - S.HOT_AT, abs=2.0)
    assert hot["source"] == "nvml:temperature_c vs slowdown threshold (hourly rollups)" + SOURCE
    summary = api.get("/api/v1/fleet/summary", params={"window": "1h"}, headers=auth(op)).json()
    attention = [a for a in summary["gpus_needing_attention"] if a["node"] == NODE]
    assert [a["gpu_uuid"] for a in attention] == [truth.bad]
    assert "temperature_near_slowdown" in {f["kind"] for f in attention[0]["findings"]}


def test_embedded_store_lists_the_faulty_gpu_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same join on SQLite (`fleetprof up`'s embedded store), whose attention probes are correlated subqueries."""
    settings = ServerSettings(database_url=f"sqlite:///{tmp_path / 'embedded.db'}", broker_url=None,
                              data_dir=tmp_path / "fleetprof")
    upgrade(settings)
    engine = make_engine(settings)

    def make_token(scope: str, team: str | None = None, node: str | None = None) -> str:
        with session_scope(make_sessionmaker(engine)) as session:
            return create_token(session, scope=scope, team=team, node=node)

    try:
        with TestClient(create_app(settings)) as api:
            post = poster(api)

            op, truth = ship_faulty_job(post, make_token, node=NODE, job_id="health-embedded")
            gpus = {g["uuid"]: g for g in api.get("/api/v1/gpus", params={"node": NODE}, headers=auth(op)).json()}
    finally:
        engine.dispose()
    assert gpus[truth.good]["findings"] == []
    found = {f["kind"]: f for f in gpus[truth.bad]["findings"]}
    assert set(found) == set(COUNTS) | FLAGS and {k: found[k]["count"] for k in COUNTS} == COUNTS
