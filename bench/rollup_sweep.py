"""The beat's rollup sweep (`server.fleet.service.rollup_hours`, last 2 h -> 3 clock hours) on a 1 Hz fleet:
wall time and the sweeping process's peak memory.

On a database of its own (dropped at the end), migrated with the real migrations: --gpus GPUs on 8-GPU nodes,
raw samples at 1 Hz over the last --hours hours (generated in SQL, the columns of bench/storage_plans.py), one
job per node; then the sweep runs in a fresh child process (so its peak RSS is the sweep's, not the generator's)
with the product's GPU range size, or with --gpus-per-range N to compare (N >= --gpus: everything in one read,
as the sweep did before it went by GPU ranges).

    .venv/bin/python bench/rollup_sweep.py [--gpus 1000] [--hours 3] [--gpus-per-range N]

At 10,000 GPUs the sweep's 3 h are 108 M raw rows (~27 GB of table at 252 B/row), more than this machine
should generate for a benchmark; the figures per GPU at 1,000-2,000 GPUs show how it scales.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from bench.scratch import insert_h100_nodes, scratch_database  # noqa: E402
from bench.storage_plans import GPUS_PER_NODE, SAMPLE_COLUMNS, SAMPLE_VALUES  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from server.migrate import upgrade  # noqa: E402
from server.storage.partitions import PARTITIONS, day_of  # noqa: E402

HOUR_S = 3600


def generate(url: str, gpus: int, hours: int, now: float) -> int:
    engine = create_engine(url)
    start = int(now) - hours * HOUR_S
    with engine.begin() as conn:
        insert_h100_nodes(conn, gpus // GPUS_PER_NODE, GPUS_PER_NODE)
        # One job per node, started an hour before the window, still running: every GPU-hour is attributed.
        conn.execute(text("INSERT INTO jobs (job_id, team, state, started_at, created_at, updated_at, extra) "
                          "SELECT format('job-%s', n.id), format('team-%s', n.id % 7), 'running', "
                          "to_timestamp(:t0), now(), now(), '{}' FROM nodes n"), {"t0": start - HOUR_S})
        conn.execute(text("INSERT INTO job_gpus (job_pk, gpu_id, source) SELECT j.id, g.id, 'registered' "
                          "FROM jobs j JOIN nodes n ON j.job_id = format('job-%s', n.id) "
                          "JOIN gpus g ON g.node_id = n.id"))
    factory = make_sessionmaker(engine)
    with session_scope(factory) as session:
        PARTITIONS.ensure(session, sorted({day_of(start), day_of(now)}))
    rows = 0
    for h in range(hours):  # hour by hour: the heap in time order, as ingest writes it
        with engine.begin() as conn:
            rows += conn.execute(text(f"""
                INSERT INTO gpu_samples ({SAMPLE_COLUMNS})
                SELECT {SAMPLE_VALUES} FROM (
                  SELECT g, s, to_timestamp(:day0 + s) AS ts, (s % 6 < 4)::int AS busy
                  FROM generate_series(CAST(:s0 AS bigint), :s0 + :n - 1) s,
                       generate_series(CAST(1 AS bigint), :g1) g) x"""),
                {"day0": 0, "s0": start + h * HOUR_S, "n": HOUR_S, "g1": gpus}).rowcount
        print(f"  hour {h + 1}/{hours}: {rows:,} rows", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return rows


def sweep(url: str, now: float, gpus_per_range: int | None, out: Any) -> None:
    """In a child process: the beat task's call, timed; peak RSS before and after."""
    from server.fleet import service

    if gpus_per_range:
        service.ROLLUP_GPUS_PER_RANGE = gpus_per_range
    engine = make_engine(ServerSettings(database_url=url))
    factory = make_sessionmaker(engine)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with session_scope(factory) as session:
        written = service.rollup_hours(session, since=now - 2 * HOUR_S, until=now, now=now)
    out.put({"seconds": time.perf_counter() - t0, "rows": written, "rss0_kib": rss0,
             "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
             "gpus_per_range": service.ROLLUP_GPUS_PER_RANGE})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=3, help="hours of 1 Hz raw samples (the sweep reads 3)")
    parser.add_argument("--gpus-per-range", type=int, action="append", default=[],
                        help="GPU range size of one read (repeat to compare; default: the product's)")
    args = parser.parse_args()
    with scratch_database("fleetprof_bench_rollup") as url:
        upgrade(ServerSettings(database_url=url))
        now = time.time()
        now -= now % 60
        t0 = time.perf_counter()
        rows = generate(url, args.gpus, args.hours, now)
        generate_s = time.perf_counter() - t0
        sweeps: dict[str, dict[str, object]] = {}
        print(f"generated {rows:,} raw rows ({args.gpus:,} GPUs x {args.hours} h at 1 Hz) in "
              f"{time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.1f}")
        ctx = multiprocessing.get_context("spawn")
        for n in args.gpus_per_range or [None]:
            q = ctx.Queue()
            p = ctx.Process(target=sweep, args=(url, now, n, q))
            p.start()
            r = q.get()
            p.join()
            print(f"rollup sweep (last 2 h -> 3 clock hours), {r['gpus_per_range']:,} GPUs per range: "
                  f"{r['seconds']:.1f} s, {r['rows']:,} gpu_hourly rows, "
                  f"{rows / r['seconds'] / 1e6:.2f} M raw rows/s, peak RSS {r['rss_kib'] / 2**10:,.0f} MiB "
                  f"(process at start {r['rss0_kib'] / 2**10:,.0f} MiB); load {os.getloadavg()[0]:.1f}")
            sweeps[f"{r['gpus_per_range']} GPUs per range"] = {
                "gpus_per_range_count": r["gpus_per_range"], "sweep_s": r["seconds"], "hourly_rows_count": r["rows"],
                "raw_rows_per_s": rows / r["seconds"], "peak_rss_bytes": r["rss_kib"] * 2**10,
                "start_rss_bytes": r["rss0_kib"] * 2**10, "load_average_1min_ratio": os.getloadavg()[0]}
        write_report(__file__, {"gpus_count": args.gpus, "hours_count": args.hours, "raw_rows_count": rows,
                                "generate_s": generate_s, "sweeps": sweeps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
