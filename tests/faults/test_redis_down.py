"""Fault: the Redis broker dies (no persistence: its queue is lost) while jobs run and end, then comes back.

Real processes: a private Postgres, a private `redis-server`, a `fleetprof server` collector and a
`fleetprof worker --beat` with `FLEETPROF_CHARACTERIZE_RUNNING_EVERY_S=2`.

Proves: with the broker gone, sample ingest and event ingest keep answering 200 promptly (the job-end
characterization enqueue fails softly, it does not fail or stall the request) while /readyz stays ready (ingest
works) and says, beside its checks, that the broker is down; nothing is characterized meanwhile; when Redis is back
the worker reconnects by itself and the beat's `characterize_due` sweep re-enqueues the ended job, whose report is
then right.
"""

from __future__ import annotations

import time

import httpx
import pytest

from fleetprof.protocol import PROTOCOL_VERSION
from tests.faults.harness import PYTHON, Proc, base_env, create_token, start_collector, wait_until
from tests.server.helpers import gz, sample_batch


def report_of(database_url: str, job_id: str) -> dict | None:
    from sqlalchemy import create_engine, select

    from server.models import Job, Report

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(Report.data).join(Job, Job.id == Report.job_pk)
                                .where(Job.job_id == job_id)).scalar()
    finally:
        engine.dispose()


def start_worker(procs: list[Proc], env: dict[str, str], tmp_path, *, beat: bool, name: str = "worker") -> Proc:
    argv = [PYTHON, "-m", "fleetprof.cli", "worker", "-c", "1", "--loglevel", "info"] + (["--beat"] if beat else [])
    p = Proc(name, argv, env, tmp_path / f"{name}.log").start()
    procs.append(p)
    wait_until(lambda: "ready" in p.log() or not p.alive(), 60, "the worker to be ready")
    assert p.alive(), p.log()[-3000:]
    return p


@pytest.mark.slow
def test_redis_down_ingest_continues_and_characterization_catches_up(fault_db, private_redis, procs, tmp_path):
    t_begin = time.monotonic()
    env = base_env(fault_db, tmp_path, broker_url=private_redis.url, FLEETPROF_CHARACTERIZE_RUNNING_EVERY_S="2")
    agent_token = create_token(env, "agent", node="*")
    operator = create_token(env, "operator")
    collector, url = start_collector(procs, env, tmp_path)
    worker = start_worker(procs, env, tmp_path, beat=True)
    auth = {"Authorization": f"Bearer {operator}"}
    agent_auth = {"Authorization": f"Bearer {agent_token}", "Content-Encoding": "gzip",
                  "Content-Type": "application/json"}
    # The broker dies first; the job is registered, fed and ended during the outage. (Had the beat already
    # characterized it while running, the sweep would not redo it: see test_sweep_redoes_stale_running_report.)
    t_kill = time.monotonic()
    private_redis.kill()
    ready = httpx.get(url + "/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["broker"] != "ok", ready.text
    assert httpx.get(url + "/healthz/broker", timeout=10).status_code == 503
    t0 = time.time() - 600
    uuid = "GPU-redis-node-0"
    r = httpx.post(url + "/api/v1/jobs", json={"job_id": "r-1", "node": "redis-node", "gpu_uuids": [uuid],
                                               "state": "running", "started_at": t0}, headers=auth, timeout=10)
    assert r.status_code in (200, 201), r.text

    # Ingest goes on without the broker: samples, then the job's end (which would enqueue characterization).
    latencies = []
    for seq, (start, n) in enumerate([(0, 30), (30, 30)], start=1):
        t = time.monotonic()
        r = httpx.post(url + "/api/v1/ingest/samples", headers=agent_auth, timeout=30,
                       content=gz(sample_batch(node="redis-node", agent_id="redis-agent", seq=seq, n=n, gpus=1,
                                               t0=t0 + start)))
        latencies.append(time.monotonic() - t)
        assert r.status_code == 200 and r.json()["accepted"] == n, r.text
    end = {"protocol_version": PROTOCOL_VERSION, "source_id": "redis-hooks", "seq": 1, "sent_at": time.time(),
           "events": [{"kind": "job_end", "job_id": "r-1", "ts": t0 + 59, "state": "finished", "exit_code": 0}]}
    t = time.monotonic()
    r = httpx.post(url + "/api/v1/ingest/events", json=end, headers={"Authorization": f"Bearer {agent_token}"},
                   timeout=30)
    latencies.append(time.monotonic() - t)
    assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    assert max(latencies) < 5, f"ingest stalled without the broker: {latencies}"
    job = httpx.get(url + "/api/v1/jobs/r-1", headers=auth, timeout=10).json()
    assert job["state"] == "finished"

    time.sleep(3)  # several beat periods: nothing can be characterized without the broker
    assert report_of(fault_db, "r-1") is None
    assert worker.alive(), worker.log()[-3000:]
    private_redis.start()  # same port, empty: the enqueue made during the outage is gone
    t_back = time.monotonic()

    data = wait_until(lambda: report_of(fault_db, "r-1"), 45, "the report after Redis came back", interval_s=0.3)
    t_report = time.monotonic()
    assert data["state"] == "finished"
    assert data["memory"]["peak_used_bytes"] == (1000 + 10 * 29) * 2**20  # sample_batch: k-th sample, 1000+10k MiB
    assert data["gpus"][0]["uuid"] == uuid
    assert data["duration_s"] == pytest.approx(59, abs=1)
    assert httpx.get(url + "/readyz", timeout=10).json()["broker"] == "ok"
    assert httpx.get(url + "/healthz/broker", timeout=10).status_code == 200
    assert worker.alive() and collector.alive()
    print(f"\nredis down {t_back - t_kill:.1f} s; ingest latencies without broker "
          f"{[round(x, 3) for x in latencies]} s; report {t_report - t_back:.1f} s after Redis returned; "
          f"test {time.monotonic() - t_begin:.1f} s")


def test_sweep_redoes_stale_running_report(fault_db):
    """The gap the two tests above steer around, at the function the beat calls: the job end whose enqueue was
    lost must be picked up by the sweep even when a report of the running job exists."""
    from sqlalchemy import create_engine

    from server.config import ServerSettings
    from server.db import make_sessionmaker, session_scope
    from server.jobs import service as job_service
    from server.jobs.report_store import compute_report
    from server.jobs.sweep import jobs_due
    from server.models import Job
    from server.models.base import from_epoch

    settings = ServerSettings(database_url=fault_db)
    engine = create_engine(fault_db)
    factory = make_sessionmaker(engine)
    t0 = time.time() - 3600
    try:
        with session_scope(factory) as session:
            job = Job(job_id="stale-1", state="running", started_at=from_epoch(t0), extra={})
            session.add(job)
            session.flush()
            compute_report(session, job, settings)  # the beat's periodic report of the running job
            pk = job.id
        time.sleep(0.05)
        with session_scope(factory) as session:  # the end arrives (its enqueue is lost); it ended 10 min ago
            job_service.mark_ended(session.get(Job, pk), ts=time.time() - 600, exit_code=0, state="finished")
        with session_scope(factory) as session:
            due = jobs_due(session, every_s=2)
    finally:
        engine.dispose()
    assert pk in due, "the ended job with a report of its running state is not due for characterization"
