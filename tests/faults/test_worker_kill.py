"""Fault: a Celery worker is killed with SIGKILL in the middle of characterizing a big job.

Real processes: a private Postgres, a private `redis-server`, a `fleetprof server` collector and
`fleetprof worker` processes. The job is big (4 GPUs x 30,000 samples), so its characterization takes seconds
and the kill lands mid-task; no test hook or delay is injected.

Two cases:
- the pool process running the task is killed (`kill -9` of the child): `acks_late` + `reject_on_worker_lost`
  (server/worker.py) put the message back, the worker's next pool process runs the task again;
- the whole worker (main process and pool, one process group) is killed and a new `worker --beat` is started:
  the message stays unacknowledged in Redis until the visibility timeout (600 s), but the beat's
  `characterize_due` sweep re-enqueues the ended job that has no report, so the report arrives within seconds.

Both prove the report is right: stored once, after the kill, equal to the characterization the test computes
itself from the same database (and its known peak).
"""

from __future__ import annotations

import re
import time

import httpx
import psutil
import pytest

from tests.faults.harness import PYTHON, Proc, base_env, create_token, start_collector, wait_until

GPUS = 4
SAMPLES = 30_000  # per GPU, 10 Hz: 50 minutes of telemetry
PEAK_MIB = 70_000


def report_row(database_url: str, job_id: str) -> tuple[dict, float] | None:
    from sqlalchemy import create_engine, select

    from server.models import Job, Report
    from server.models.base import to_epoch

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(Report.data, Report.computed_at).join(Job, Job.id == Report.job_pk)
                               .where(Job.job_id == job_id)).first()
    finally:
        engine.dispose()
    return None if row is None else (row[0], to_epoch(row[1]))


def final_report(database_url: str, job_id: str, *, after: float = 0.0) -> tuple[dict, float] | None:
    """The stored report once it describes the ended job (computed after `after`). With a beat running, reports
    of the job while it was still running may exist before."""
    row = report_row(database_url, job_id)
    if row is None or row[0].get("state") != "finished" or row[1] <= after:
        return None
    return row


def _ensure_partitions(engine, start: float, end: float) -> None:  # type: ignore[no-untyped-def]
    """The raw INSERT below bypasses ingest, which creates the daily partitions of gpu_samples it needs."""
    from sqlalchemy.orm import Session

    from server.storage.partitions import PartitionManager, day_of

    with Session(engine) as session, session.begin():
        PartitionManager().ensure(session, range(day_of(start), day_of(end) + 1))


def make_big_job(url: str, operator: str, database_url: str, job_id: str) -> float:
    """Register a running job on GPUS GPUs and fill their telemetry straight in SQL; returns its start."""
    from sqlalchemy import create_engine, text

    t0 = time.time() - SAMPLES / 10 - 600
    uuids = [f"GPU-{job_id}-{i}" for i in range(GPUS)]
    r = httpx.post(url + "/api/v1/jobs", json={"job_id": job_id, "node": f"{job_id}-node", "gpu_uuids": uuids,
                                               "state": "running", "started_at": t0},
                   headers={"Authorization": f"Bearer {operator}"}, timeout=30)
    assert r.status_code in (200, 201), r.text
    engine = create_engine(database_url)
    _ensure_partitions(engine, t0, t0 + SAMPLES / 10)
    with engine.begin() as conn:
        conn.execute(text("UPDATE gpus SET name = 'NVIDIA H100 80GB HBM3', memory_total_bytes = 85520809984, "
                          "power_source = 'field:NVML_FI_DEV_POWER_INSTANT' WHERE uuid LIKE :p"),
                     {"p": f"GPU-{job_id}-%"})
        # A training-like pattern per GPU; one spike to PEAK_MIB on GPU 2 half-way.
        conn.execute(text(f"""
            INSERT INTO gpu_samples (gpu_id, ts, memory_used_bytes, memory_total_bytes, gpu_util_pct, mem_util_pct,
                                     power_w, energy_counter_j, temperature_c, sm_clock_mhz)
            SELECT g.id, to_timestamp(:t0 + i * 0.1),
                   (CASE WHEN g.index = 2 AND i = {SAMPLES // 2} THEN {PEAK_MIB}
                         ELSE 30000 + (i * 7919 + g.index * 13) % 20011 END)::bigint * 1048576,
                   85520809984, (i * 37 + g.index) % 100, (i * 11) % 60,
                   300 + (i % 50) * 4 + g.index, 1000000 + i * 35.0 + g.index, 60 + i % 20, 1755
            FROM gpus g CROSS JOIN generate_series(0, {SAMPLES - 1}) AS i
            WHERE g.uuid LIKE :p"""), {"t0": t0, "p": f"GPU-{job_id}-%"})
    engine.dispose()
    return t0


def end_job(url: str, operator: str, job_id: str, t0: float) -> None:
    r = httpx.post(url + "/api/v1/jobs", json={"job_id": job_id, "state": "finished", "exit_code": 0,
                                               "ended_at": t0 + SAMPLES / 10},
                   headers={"Authorization": f"Bearer {operator}"}, timeout=30)
    assert r.status_code in (200, 201), r.text


def expected_report(database_url: str, job_id: str) -> dict:
    """The characterization computed here, from the same database, without storing it."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from server.analysis.characterize import characterize
    from server.config import ServerSettings
    from server.jobs.loader import load_job_data
    from server.models import Job

    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            job = session.scalars(select(Job).where(Job.job_id == job_id)).one()
            now = time.time()
            return characterize(load_job_data(session, job, ServerSettings(database_url=database_url), now=now),
                                now=now)
    finally:
        engine.dispose()


def assert_report_right(got: dict, want: dict) -> None:
    assert got["memory"]["peak_used_bytes"] == PEAK_MIB * 2**20
    assert len(got["gpus"]) == GPUS
    for key in ("state", "duration_s", "gpus", "memory", "utilization", "energy", "time"):
        assert got[key] == pytest.approx(want[key]) if isinstance(want[key], float) else got[key] == want[key], key


def start_worker(procs: list[Proc], env: dict[str, str], tmp_path, *, beat: bool, name: str) -> Proc:
    argv = [PYTHON, "-m", "fleetprof.cli", "worker", "-c", "1", "--loglevel", "info"] + (["--beat"] if beat else [])
    p = Proc(name, argv, env, tmp_path / f"{name}.log").start()
    procs.append(p)
    wait_until(lambda: " ready." in p.log() or not p.alive(), 90, f"{name} to be ready")
    assert p.alive(), p.log()[-3000:]
    return p


def received(worker: Proc) -> list[str]:
    return re.findall(r"Task fleetprof\.characterize_job\[([0-9a-f-]+)\] received", worker.log())


@pytest.mark.slow
def test_worker_pool_process_killed_mid_task_reruns(fault_db, private_redis, procs, tmp_path):
    t_begin = time.monotonic()
    env = base_env(fault_db, tmp_path, broker_url=private_redis.url)
    operator = create_token(env, "operator")
    collector, url = start_collector(procs, env, tmp_path)
    worker = start_worker(procs, env, tmp_path, beat=False, name="worker")
    t0 = make_big_job(url, operator, fault_db, "big-1")
    end_job(url, operator, "big-1", t0)  # enqueues characterization

    wait_until(lambda: received(worker), 30, "the task to reach the worker", interval_s=0.02)
    # Inside the task (loading and characterizing 120,000 samples: ~1 s idle). The "received" line can reach the log
    # late on a loaded machine (a second xdist worker): kill at once rather than after a further pause. A kill
    # before the body starts is still a kill of the pool process holding the unacknowledged task (acks_late).
    time.sleep(0.02)
    children = psutil.Process(worker.pid).children(recursive=True)
    assert len(children) == 1, children
    t_kill = time.time()
    children[0].kill()
    assert final_report(fault_db, "big-1") is None, "the task finished before the kill: make the job bigger"

    row = wait_until(lambda: final_report(fault_db, "big-1"), 50, "the re-run's report", interval_s=0.3)
    t_report = time.time()
    data, computed_at = row
    assert computed_at > t_kill
    log = worker.log()
    assert "SIGKILL" in log or "WorkerLostError" in log, log[-3000:]
    task_ids = received(worker)
    assert len(task_ids) >= 2 and task_ids[0] == task_ids[1], f"the same task was not redelivered: {task_ids}"
    assert re.search(rf"characterize_job\[{task_ids[0]}\] succeeded", log), log[-3000:]
    assert_report_right(data, expected_report(fault_db, "big-1"))
    assert worker.alive() and collector.alive()
    print(f"\npool process killed 0.2 s into the task; report {t_report - t_kill:.1f} s after the kill (same task "
          f"id {task_ids[0]} redelivered); test {time.monotonic() - t_begin:.1f} s")


@pytest.mark.slow
def test_whole_worker_killed_mid_task_beat_sweep_recovers(fault_db, private_redis, procs, tmp_path):
    t_begin = time.monotonic()
    # A short sweep period (recovery latency); not shorter: the sweep re-enqueues a due job every period, even
    # while a characterization of it is queued or running (they pile up when one takes longer than a period).
    env = base_env(fault_db, tmp_path, broker_url=private_redis.url, FLEETPROF_CHARACTERIZE_RUNNING_EVERY_S="4")
    operator = create_token(env, "operator")
    collector, url = start_collector(procs, env, tmp_path)
    # The job ends before any worker runs: no report of it exists when the worker dies (see
    # test_sweep_redoes_stale_running_report for the case where one does).
    t0 = make_big_job(url, operator, fault_db, "big-2")
    end_job(url, operator, "big-2", t0)
    worker = start_worker(procs, env, tmp_path, beat=True, name="worker")

    wait_until(lambda: received(worker), 30, "the task to reach the worker", interval_s=0.05)
    time.sleep(0.2)
    t_kill = time.time()
    worker.kill9()  # main process, beat and pool: the whole process group
    assert final_report(fault_db, "big-2") is None, "the task finished before the kill: make the job bigger"

    worker2 = start_worker(procs, env, tmp_path, beat=True, name="worker2")
    row = wait_until(lambda: final_report(fault_db, "big-2", after=t_kill), 60, "the report after the restart",
                     interval_s=0.3)
    t_report = time.time()
    data, computed_at = row
    assert computed_at > t_kill
    assert_report_right(data, expected_report(fault_db, "big-2"))
    assert worker2.alive() and collector.alive()
    print(f"\nwhole worker killed; report {t_report - t_kill:.1f} s after the kill via the beat sweep; "
          f"test {time.monotonic() - t_begin:.1f} s")
