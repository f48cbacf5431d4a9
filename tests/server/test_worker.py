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


def test_beat_rollup_fans_out_one_task_per_gpu_range_to_a_real_worker(server_settings, redis_url, make_token,
                                                                        worker):
    """fleetprof.rollup_recent queues one fleetprof.rollup_range per GPU range, and one per run of backlog hours
    (node-r2's samples arrive 5 hours late, as from an agent's spool after an outage: the recent sweep alone would
    never roll them up); the worker writes every GPU's hourly rollups, the same as the sweep of all those hours run
    in one process (the embedded mode's path), and empties the backlog."""
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, func, select, text

    from server.app import create_app
    from server.db import make_sessionmaker, session_scope
    from server.fleet.service import ROLLUP_GPUS_PER_RANGE, rollup_hours, rollup_ranges
    from server.models import GpuHourly, RollupBacklog
    from server.worker import create_celery_app

    settings = server_settings.model_copy(update={"broker_url": redis_url})
    engine = create_engine(settings.database_url)
    t_late = time.time() - 5 * 3600 - 900
    with TestClient(create_app(settings)) as api:
        for node, t0 in (("node-r1", time.time() - 900), ("node-r2", t_late)):
            assert api.post("/api/v1/ingest/samples", json=sample_batch(node=node, agent_id=node, n=600, gpus=2, t0=t0),
                            headers=auth(make_token("agent", node=node))).status_code == 200
            with engine.begin() as conn:  # the next node's GPUs in another range
                conn.execute(text("SELECT setval(pg_get_serial_sequence('gpus', 'id'), "
                                  "(SELECT max(id) FROM gpus) + :w)"), {"w": ROLLUP_GPUS_PER_RANGE})
    with session_scope(make_sessionmaker(engine)) as session:
        assert len(rollup_ranges(session)) >= 2
        assert session.scalar(select(func.count()).select_from(RollupBacklog)) >= 1  # node-r2's late hour(s)

    def rows() -> list[tuple]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(select(GpuHourly.gpu_id, GpuHourly.hour, GpuHourly.samples,
                                                          GpuHourly.busy_s, GpuHourly.energy_j)
                                                   .order_by(GpuHourly.gpu_id, GpuHourly.hour))]

    app = create_celery_app(settings)
    app.send_task("fleetprof.rollup_recent")
    deadline = time.monotonic() + 60
    fanned_out: list[tuple] = []
    while time.monotonic() < deadline and len({r[0] for r in fanned_out}) < 4:
        time.sleep(0.5)
        fanned_out = rows()
    assert len({r[0] for r in fanned_out}) == 4, f"rollups of {len({r[0] for r in fanned_out})} GPUs, not 4"
    assert sum(r[2] for r in fanned_out) == 4 * 600
    with session_scope(make_sessionmaker(engine)) as session:
        assert session.scalar(select(func.count()).select_from(RollupBacklog)) == 0
    now = time.time()
    with session_scope(make_sessionmaker(engine)) as session:  # the same hours, in one process
        rollup_hours(session, since=t_late, until=now, now=now)
    assert rows() == fanned_out
    engine.dispose()
    assert worker.poll() is None, "worker died"


def test_the_beat_ends_a_job_no_longer_seen_and_a_real_worker_reports_it(server_settings, redis_url, make_token,
                                                                         worker):
    """fleetprof.characterize_due (the beat, every minute) ends the job whose processes the agent last saw an hour
    ago (server.jobs.unseen) and queues its characterization: the worker stores its final report, state lost."""
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, select

    from server.app import create_app
    from server.models import Job, Report
    from server.worker import create_celery_app

    settings = server_settings.model_copy(update={"broker_url": redis_url})
    t0 = time.time() - 3600
    batch = sample_batch(node="node-b", n=30, gpus=1, t0=t0)
    batch["processes"] = {"ts": batch["samples"]["ts"], "gpu_uuid": batch["samples"]["gpu_uuid"],
                          "pid": [99] * 30, "used_memory_bytes": [2**30] * 30, "job_id": ["k8s:pod-gone"] * 30,
                          "attribution": ["k8s:pod"] * 30}
    with TestClient(create_app(settings)) as api:
        assert api.post("/api/v1/ingest/samples", json=batch,
                        headers=auth(make_token("agent", node="node-b"))).status_code == 200
    create_celery_app(settings).send_task("fleetprof.characterize_due")
    engine = create_engine(settings.database_url)
    deadline = time.monotonic() + 60
    data = None
    while time.monotonic() < deadline and data is None:
        time.sleep(0.5)
        with engine.connect() as conn:
            data = conn.execute(select(Report.data).join(Job, Job.id == Report.job_pk)
                                .where(Job.job_id == "k8s:pod-gone")).scalar()
    with engine.connect() as conn:
        state, ended = conn.execute(select(Job.state, Job.ended_at).where(Job.job_id == "k8s:pod-gone")).one()
    engine.dispose()
    assert state == "lost" and ended.timestamp() == pytest.approx(t0 + 29, abs=1e-3)
    assert data is not None, "the worker did not store a report"
    assert data["state"] == "lost" and data["duration_s"] == pytest.approx(29, abs=0.01)
    assert worker.poll() is None, "worker died"
