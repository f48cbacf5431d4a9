"""The characterization and fleet figures with the database in the loop (Postgres on this machine).

1. A 24 h, 8-GPU job at 1 Hz (691,200 samples, the synthetic load of bench/characterize.py, and as many process
   rows: each GPU's rank process, as the agent lists it) is written through the real bulk-insert path, then characterized the way a worker does it (load from Postgres, analyze, store
   the report): target <= 10 s.
2. 10,000 GPUs x 24 h of hourly rollups (240,000 rows), the last 5 minutes of samples of every GPU (one per
   10 s: what "idle now" reads), and --fleet-jobs jobs active in the window, each with a stored report (the real
   report of step 1, ~full size: what "stranded memory" and "most wasteful jobs" read); then
   GET /api/v1/fleet/summary: target <= 200 ms.

    .venv/bin/python bench/characterize_db.py [--hours 24] [--gpus 8] [--fleet-gpus 10000] [--fleet-jobs 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from sqlalchemy import text, update

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.characterize import synthetic_job  # noqa: E402
from bench.report import write_report  # noqa: E402
from bench.scratch import scratch_database  # noqa: E402
from server.analysis.characterize import ANALYZER_VERSION  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from server.migrate import upgrade  # noqa: E402
from server.models import Gpu, GpuHourly, GpuSample, Job, JobGpu, Node, ProcessSample, Report  # noqa: E402
from server.models.base import from_epoch  # noqa: E402
from server.storage.bulk import insert_ignore  # noqa: E402

COLUMNS = ("memory_used_bytes", "gpu_util_pct", "power_w", "energy_counter_j")


def load_job(factory, job) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    with session_scope(factory) as session:
        node = Node(name="bench-node", dropped_samples_total=0)
        session.add(node)
        session.flush()
        row = Job(job_id="bench-24h", state="finished", started_at=from_epoch(job.started_at),
                  ended_at=from_epoch(job.ended_at), extra={})
        session.add(row)
        session.flush()
        for i, g in enumerate(job.gpus):
            gpu = Gpu(node_id=node.id, uuid=g.uuid, index=i, name=g.name or "H100", healthy=True,
                      memory_total_bytes=g.memory_total_bytes)
            session.add(gpu)
            session.flush()
            session.add(JobGpu(job_pk=row.id, gpu_id=gpu.id, source="registered"))
            step = 50_000
            for a in range(0, g.ts.size, step):
                names = ["gpu_id", "ts", *COLUMNS]
                cols: list[list[object]] = [[gpu.id] * len(g.ts[a:a + step]), g.ts[a:a + step].tolist()]
                for c in COLUMNS:
                    v = g.columns[c][a:a + step]
                    cols.append([None if np.isnan(x) else (int(x) if c.endswith("_bytes") else float(x)) for x in v])
                insert_ignore(session, GpuSample.__table__, names, cols)
                # The rank's process, as the agent lists it at every full reading (NVML per-process memory:
                # the device's used memory less the CUDA context's share it does not attribute to processes).
                used = g.columns["memory_used_bytes"][a:a + step]
                insert_ignore(session, ProcessSample.__table__,
                              ["gpu_id", "ts", "pid", "used_memory_bytes", "job_id", "attribution"],
                              [cols[0], cols[1], [4100 + i] * len(cols[0]),
                               [None if np.isnan(x) else int(x) - 512 * 2**20 for x in used],
                               ["bench-24h"] * len(cols[0]), ["env:FLEETPROF_JOB_ID"] * len(cols[0])])
        job_pk = row.id
    return job_pk, time.perf_counter() - start


def load_fleet(factory, n_gpus: int, hours: int, now: float, *, jobs: int,  # type: ignore[no-untyped-def]
               report: dict) -> float:
    start = time.perf_counter()
    with session_scope(factory) as session:
        nodes = []
        for n in range(n_gpus // 8):
            nodes.append(Node(name=f"fleet-{n:05d}", dropped_samples_total=0))
        session.add_all(nodes)
        session.flush()
        gpus = [Gpu(node_id=node.id, uuid=f"GPU-{node.name}-{i}", index=i, name="NVIDIA H100 80GB HBM3",
                    healthy=True) for node in nodes for i in range(8)]
        session.add_all(gpus)
        session.flush()
        ids = [g.id for g in gpus]
    rng = np.random.default_rng(0)
    h0 = now - now % 3600 - hours * 3600
    with session_scope(factory) as session:
        for h in range(hours):
            util = rng.uniform(0, 100, len(ids))
            insert_ignore(session, GpuHourly.__table__,
                          ["gpu_id", "hour", "samples", "covered_s", "busy_s", "util_busy_s", "energy_j",
                           "memory_peak_bytes", "util_mean_pct"],
                          [ids, [h0 + h * 3600] * len(ids), [3600] * len(ids), [3600.0] * len(ids),
                           (3600 * (util >= 5)).tolist(), (36 * util).tolist(), (3600 * (80 + 3.2 * util)).tolist(),
                           [int(4e10)] * len(ids), util.tolist()], time_columns=frozenset({"hour"}))
        recent = np.arange(now - 300, now, 10.0)
        insert_ignore(session, GpuSample.__table__, ["gpu_id", "ts", "gpu_util_pct"],
                      [np.repeat(ids, recent.size).tolist(), np.tile(recent, len(ids)).tolist(),
                       rng.uniform(0, 100, len(ids) * recent.size).tolist()])
    from server.analysis.fleet.rollup import job_fleet_row

    with session_scope(factory) as session:
        rows = [Job(job_id=f"fleet-job-{j:06d}", state="running", started_at=from_epoch(now - 3600), extra={})
                for j in range(jobs)]
        session.add_all(rows)
        session.flush()
        for a in range(0, len(rows), 500):
            session.execute(Report.__table__.insert(), [
                {"job_pk": r.id, "analyzer_version": ANALYZER_VERSION, "computed_at": from_epoch(now),
                 "data": {**report, "job_id": r.job_id}, "fleet_row": job_fleet_row({**report, "job_id": r.job_id})}
                for r in rows[a:a + 500]])
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--fleet-gpus", type=int, default=10_000)
    parser.add_argument("--fleet-jobs", type=int, default=5_000, help="jobs active in the window, with reports")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--summary-calls", type=int, default=30)
    args = parser.parse_args()
    with scratch_database("fleetprof_bench_char") as url:
        settings = ServerSettings(database_url=url)
        upgrade(settings)
        engine = make_engine(settings)
        factory = make_sessionmaker(engine)
        job = synthetic_job(hours=args.hours, n_gpus=args.gpus)
        samples = sum(g.ts.size for g in job.gpus)
        job_pk, load_s = load_job(factory, job)
        from server.jobs.report_store import characterize_job_pk

        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            characterize_job_pk(factory, job_pk, settings)
            times.append(time.perf_counter() - start)

        from fastapi.testclient import TestClient

        from server.app import create_app
        from server.auth.service import create_token

        now = time.time()
        with session_scope(factory) as session:
            report = session.get(Report, (job_pk, ANALYZER_VERSION)).data
        fleet_load_s = load_fleet(factory, args.fleet_gpus, 24, now, jobs=args.fleet_jobs, report=report)
        # What autovacuum does in production (it is off on this machine): statistics for the planner.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        with session_scope(factory) as session:
            token = create_token(session, scope="operator")
        lat = []
        with TestClient(create_app(settings)) as api:
            for _ in range(args.summary_calls + 1):
                start = time.perf_counter()
                r = api.get("/api/v1/fleet/summary", params={"window": "24h"}, headers={"Authorization": f"Bearer {token}"})
                lat.append(time.perf_counter() - start)
                assert r.status_code == 200, r.text
            body = r.json()
        first, lat = lat[0], sorted(lat[1:])
        # The same job while it still runs: the beat characterizes it every minute. The first run in a process reads
        # everything; the next ones what came since (server.jobs.running_cache.RUNNING_SERIES).
        with session_scope(factory) as session:
            session.execute(update(Job).where(Job.id == job_pk).values(state="running", ended_at=None))
        running = []
        for _ in range(args.repeat + 1):
            start = time.perf_counter()
            characterize_job_pk(factory, job_pk, settings)
            running.append(time.perf_counter() - start)
        engine.dispose()
        print(f"{'job samples (24 h x GPUs x 1 Hz)':<44}{samples:,}")
        print(f"{'write through bulk insert (+ process rows)':<44}{load_s:.1f} s")
        print(f"{'characterize (load + analyze + store) best':<44}{min(times):.2f} s   (target <= 10 s)")
        print(f"{'characterize median':<44}{statistics.median(times):.2f} s")
        print(f"{'running: first run / next runs (median)':<44}{running[0]:.2f} s / {statistics.median(running[1:]):.2f} s"
              f"   (the next ones read only what came since)")
        print(f"{'fleet rollup rows (GPUs x 24 h)':<44}{args.fleet_gpus * 24:,}  (fleet loaded in {fleet_load_s:.1f} s)")
        print(f"{'fleet jobs with reports (report size)':<44}{args.fleet_jobs:,}  ({len(json.dumps(report)) / 1024:.0f} kB "
              f"of JSON each)")
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        print(f"{f'GET /fleet/summary p50 / p95 / max ({len(lat)} calls)':<48}{statistics.median(lat) * 1000:.0f} / "
              f"{p95 * 1000:.0f} / {max(lat) * 1000:.0f} ms   (target <= 200 ms; the first call, opening the "
              f"reader connections: {first * 1000:.0f} ms)")
        print(f"{'load average after':<44}{os.getloadavg()[0]:.1f}")
        print(f"{'summary: gpus / gpu_hours / busy_fraction':<44}{body['gpus']} / {body['gpu_hours']:.0f} / "
              f"{body['busy_fraction']:.3f}")
        print(f"{'summary: idle now / stranded / wasteful':<44}{body['idle_gpus_now']} / "
              f"{body['memory_stranded_bytes'] or 0:.3g} B / {len(body['most_wasteful_jobs'])} listed")
        write_report(__file__, {
            "job_samples_count": samples, "bulk_insert_s": load_s, "characterize_best_s": min(times),
            "characterize_median_s": statistics.median(times), "running_first_s": running[0],
            "running_next_median_s": statistics.median(running[1:]), "fleet_rollup_rows_count": args.fleet_gpus * 24,
            "fleet_load_s": fleet_load_s, "fleet_jobs_count": args.fleet_jobs, "report_json_bytes": len(json.dumps(report)),
            "summary_calls_count": len(lat), "summary_p50_ms": statistics.median(lat) * 1000, "summary_p95_ms": p95 * 1000,
            "summary_max_ms": max(lat) * 1000, "summary_first_call_ms": first * 1000,
            "load_average_1min_ratio": os.getloadavg()[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
