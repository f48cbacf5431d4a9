"""The Celery wiring, with a real worker process on the real Redis (not eager mode)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.server.helpers import auth, sample_batch


@pytest.fixture
def worker(cli_env, redis_url, tmp_path):
    env = {**cli_env, "FLEETPROF_BROKER_URL": redis_url}
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "worker", "-c", "1", "--loglevel", "info"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    yield proc
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_job_end_is_characterized_by_a_real_worker(server_settings, redis_url, make_token, worker):
    from fastapi.testclient import TestClient

    from server.app import create_app

    settings = server_settings.model_copy(update={"broker_url": redis_url})
    agent, op = make_token("agent", node="node-a"), make_token("operator")
    t0 = time.time() - 600
    with TestClient(create_app(settings)) as api:
        api.post("/api/v1/jobs", json={"job_id": "w-1", "node": "node-a", "gpu_uuids": ["GPU-node-a-0"],
                                       "state": "running", "started_at": t0}, headers=auth(op))
        assert api.post("/api/v1/ingest/samples", json=sample_batch(n=60, gpus=1, t0=t0),
                        headers=auth(agent)).status_code == 200
        # Ending the job enqueues characterization on Redis; the worker process computes and stores the report.
        api.post("/api/v1/jobs", json={"job_id": "w-1", "state": "finished", "ended_at": t0 + 59},
                 headers=auth(op))
    from sqlalchemy import create_engine, select

    from server.models import Job, Report

    engine = create_engine(settings.database_url)
    deadline = time.monotonic() + 60
    data = None
    while time.monotonic() < deadline and data is None:
        with engine.connect() as conn:
            data = conn.execute(select(Report.data).join(Job, Job.id == Report.job_pk)
                                .where(Job.job_id == "w-1")).scalar()
        time.sleep(0.5)
    engine.dispose()
    assert data is not None, "the worker did not store a report"
    assert data["memory"]["peak_used_bytes"] == (1000 + 10 * 59) * 2**20
    assert data["state"] == "finished"
    assert worker.poll() is None, "worker died"
