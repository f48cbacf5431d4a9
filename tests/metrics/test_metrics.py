"""/metrics: the service's own figures, Celery queue depth and task latency; /metrics/fleet: the fleet's, from the
database (and, when asked, the stored DCGM-compatible GPU gauges); and a real Prometheus server (Debian package
`prometheus`) scraping a real `fleetprof server` and answering queries. The agents' GPU series and two collector
replicas behind one Prometheus: tests/metrics/test_fleet_prometheus.py."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from server.metrics import celery_queue_keys, record_task_duration, task_stats_key
from tests.conftest import free_port, wait_http
from tests.metrics.prom import prometheus_binary as _prometheus_binary
from tests.metrics.prom import query as _query
from tests.metrics.prom import wait_query as _wait_query
from tests.security.conftest import server_process
from tests.server.helpers import auth, sample_batch

GPU_MIB = 1000 + 10 * 9  # helpers.sample_batch: GPU 0's memory at the last of 10 instants, in MiB


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}(\{{(.*)\}})? (\S+)", line)
        if m and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            return float(m.group(3))
    return None


@pytest.fixture
def broker_api(server_settings, redis_url):
    from server.app import create_app

    with TestClient(create_app(server_settings.model_copy(update={"broker_url": redis_url}))) as client:
        yield client


def test_metrics_cover_ingest_rejections_queue_tasks_and_gpus(broker_api, make_token, server_settings, redis_url):
    agent = make_token("agent", node="node-m")
    before = broker_api.get("/metrics").text
    r = broker_api.post("/api/v1/ingest/samples", json=sample_batch(node="node-m", t0=time.time() - 30),
                        headers=auth(agent))
    assert r.status_code == 200
    assert broker_api.post("/api/v1/ingest/samples", json=sample_batch(node="node-m", protocol_version=99),
                           headers=auth(agent)).status_code == 422
    # Work waiting in the Celery queue (pushed by hand: no worker runs here) and durations workers recorded.
    queue = server_settings.queue_name
    client = redis.Redis.from_url(redis_url)
    client.delete(*celery_queue_keys(queue), task_stats_key(queue))  # earlier tests' real workers recorded some
    client.lpush(celery_queue_keys(queue)[0], "t1", "t2")
    client.lpush(celery_queue_keys(queue)[1], "t3")  # a priority sub-queue counts too
    for seconds in (0.2, 0.7, 40.0):
        record_task_duration(client, queue, "fleetprof.characterize_job", seconds)
    try:
        text = broker_api.get("/metrics").text
    finally:
        client.delete(*celery_queue_keys(queue), task_stats_key(queue))
    assert (_value(text, "fleetprof_ingest_samples_total") - (_value(before, "fleetprof_ingest_samples_total") or 0)
            == 20)
    assert _value(text, "fleetprof_ingest_rejected_total", reason="protocol_version") >= 1
    assert _value(text, "fleetprof_ingest_batches_total", kind="samples", duplicate="false") >= 1
    assert _value(text, "fleetprof_broker_up") == 1
    assert _value(text, "fleetprof_queue_depth", queue=queue) == 3
    task = {"task": "fleetprof.characterize_job"}
    assert _value(text, "fleetprof_worker_task_duration_seconds_count", **task) == 3
    assert _value(text, "fleetprof_worker_task_duration_seconds_bucket", le="1.0", **task) == 2
    assert _value(text, "fleetprof_worker_task_duration_seconds_sum", **task) == pytest.approx(40.9)
    ingest = {"route": "/api/v1/ingest/samples"}
    assert _value(text, "fleetprof_http_request_duration_seconds_count", status="200", **ingest) >= 1
    assert _value(text, "fleetprof_http_request_duration_seconds_count", status="422", **ingest) >= 1
    # GPU series are the agents' now (issue #20): a collector's /metrics has none, whatever it stored.
    assert not re.search(r"^DCGM_", text, re.MULTILINE)
    # The fleet's figures, from the database: /metrics/fleet, scraped once per fleet.
    fleet = broker_api.get("/metrics/fleet").text
    assert _value(fleet, "fleetprof_fleet_gpus_reporting") >= 2 and _value(fleet, "fleetprof_fleet_nodes_reporting") >= 1
    assert _value(fleet, "fleetprof_rollup_backlog_hours") is not None and "DCGM_" not in fleet


def test_the_fleet_endpoint_keeps_the_stored_gpu_gauges_when_asked(server_settings, make_token):
    """FLEETPROF_FLEET_METRICS_GPU_GAUGES: what /metrics carried before issue #20, for fleets whose agents
    Prometheus cannot reach, on the endpoint scraped once."""
    from server.app import create_app

    settings = server_settings.model_copy(update={"fleet_metrics_gpu_gauges": True})
    with TestClient(create_app(settings)) as api:
        agent = make_token("agent", node="node-m")
        r = api.post("/api/v1/ingest/samples", json=sample_batch(node="node-m", t0=time.time() - 30),
                     headers=auth(agent))
        assert r.status_code == 200
        text = api.get("/metrics/fleet").text
        assert not re.search(r"^DCGM_", api.get("/metrics").text, re.MULTILINE)
    # DCGM-exporter names and labels, the units DCGM uses (MiB, W), and no job label (cardinality).
    labels = {"UUID": "GPU-node-m-0", "Hostname": "node-m", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3"}
    assert _value(text, "DCGM_FI_DEV_FB_USED", **labels) == GPU_MIB
    assert _value(text, "DCGM_FI_DEV_POWER_USAGE", **labels) == 109.0
    assert _value(text, "DCGM_FI_DEV_GPU_UTIL", UUID="GPU-node-m-1") == float((9 * 7) % 100)
    assert "# TYPE DCGM_FI_DEV_FB_USED gauge" in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert not re.search(r"^DCGM_\w+\{[^}]*job", text, re.MULTILINE)


def test_a_broker_that_is_down_does_not_fail_the_scrape(server_settings):
    from server.app import create_app

    settings = server_settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{free_port()}/0"})
    with TestClient(create_app(settings)) as client:
        r = client.get("/metrics")
    assert r.status_code == 200
    assert _value(r.text, "fleetprof_broker_up") == 0 and "fleetprof_ingest_samples_total" in r.text


@pytest.mark.slow
def test_a_real_prometheus_scrapes_fleetprof_and_answers_queries(cli_env, make_token, redis_url, tmp_path):
    binary = _prometheus_binary()
    env = dict(cli_env, FLEETPROF_BROKER_URL=redis_url)
    agent, team = make_token("agent", node="node-p"), make_token("team", team="alpha")
    queue = cli_env["FLEETPROF_QUEUE_NAME"]
    redis.Redis.from_url(redis_url).delete(*celery_queue_keys(queue), task_stats_key(queue))
    with server_process(env, tmp_path / "server.log") as url:
        now = time.time()
        assert httpx.post(url + "/api/v1/ingest/samples", json=sample_batch(node="node-p", t0=now - 30),
                          headers=auth(agent)).status_code == 200
        # A job that ends is queued for characterization on the broker: no worker yet, so it waits there.
        r = httpx.post(url + "/api/v1/jobs", json={"job_id": "prom-1", "state": "finished", "started_at": now - 60,
                                                   "ended_at": now - 1}, headers=auth(team))
        assert r.status_code == 200
        port = free_port()
        target = url.removeprefix("http://")
        config = tmp_path / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                          f"  - job_name: fleetprof\n    static_configs:\n      - targets: ['{target}']\n")
        with open(tmp_path / "prometheus.log", "w") as log:
            prom_proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{port}"], stdout=log,
                                         stderr=subprocess.STDOUT)
            prom = f"http://127.0.0.1:{port}"
            worker = None
            try:
                wait_http(prom + "/-/ready", timeout_s=60)
                up = _wait_query(prom, 'up{job="fleetprof"}', lambda r: r[0]["value"][1] == "1")
                assert up[0]["metric"]["instance"] == target
                ok = _wait_query(prom, 'fleetprof_http_request_duration_seconds_count{route="/api/v1/ingest/samples"}',
                                 lambda r: True)
                assert ok[0]["metric"]["status"] == "200"
                assert float(_wait_query(prom, "fleetprof_ingest_samples_total", lambda r: True)[0]["value"][1]) == 20
                assert _wait_query(prom, "fleetprof_queue_depth", lambda r: float(r[0]["value"][1]) >= 1)
                # A real Celery worker drains the queue; its task durations reach the scrape through Redis.
                worker = subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "worker", "-c", "1"], env=env,
                                          stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT)
                _wait_query(prom, 'fleetprof_worker_task_duration_seconds_count{task="fleetprof.characterize_job"}',
                            lambda r: float(r[0]["value"][1]) >= 1, timeout_s=90)
                _wait_query(prom, "fleetprof_queue_depth", lambda r: float(r[0]["value"][1]) == 0)
                rate = _query(prom, "rate(fleetprof_ingest_samples_total[1m])")
                assert rate and float(rate[0]["value"][1]) >= 0
            finally:
                for proc in (worker, prom_proc):
                    if proc is not None:
                        proc.terminate()
                        try:
                            proc.wait(15)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait(5)
    assert Path(tmp_path / "prometheus.log").exists()
