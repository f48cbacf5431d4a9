"""Readiness means "can accept ingest" (issue 15.6): a broker outage must not take collectors out of rotation.

A real `fleetprof server` on the session's Postgres with its broker URL pointing at a closed port: /readyz stays 200
and ingest is acknowledged, while the broker's own signals (/healthz/broker, readyz's `broker` field and the
`fleetprof_broker_up` metric) say it is down.
"""

from __future__ import annotations

import httpx

from tests.conftest import free_port, server_process
from tests.server.helpers import gz, sample_batch


def test_redis_unreachable_keeps_the_collector_ready_and_ingesting(cli_env, make_token, tmp_path):
    env = dict(cli_env, FLEETPROF_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    token = make_token("agent", node="node-a")
    with server_process(env, tmp_path / "server.log") as url:
        ready = httpx.get(url + "/readyz", timeout=10)
        broker = httpx.get(url + "/healthz/broker", timeout=10)
        ingest = httpx.post(url + "/api/v1/ingest/samples", content=gz(sample_batch(n=5)), timeout=30,
                            headers={"Authorization": f"Bearer {token}", "Content-Encoding": "gzip",
                                     "Content-Type": "application/json"})
        metrics = httpx.get(url + "/metrics", timeout=10).text
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok"}
    assert ready.json()["broker"].startswith("error"), ready.text
    assert broker.status_code == 503 and broker.json()["broker"].startswith("error"), broker.text
    assert ingest.status_code == 200 and ingest.json()["accepted"] == 10, ingest.text
    assert "fleetprof_broker_up 0.0" in metrics


def test_broker_signals_when_it_answers_and_when_there_is_none(server_settings, redis_url):
    from fastapi.testclient import TestClient

    from server.app import create_app

    with TestClient(create_app(server_settings.model_copy(update={"broker_url": redis_url}))) as client:
        assert client.get("/healthz/broker").json() == {"status": "ok", "broker": "ok"}
        assert client.get("/readyz").json()["broker"] == "ok"
    with TestClient(create_app(server_settings)) as client:  # embedded tasks: no broker to be down
        answer = client.get("/healthz/broker")
    assert answer.status_code == 200 and answer.json()["broker"].startswith("not used"), answer.text
