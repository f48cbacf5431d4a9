"""Storage at scale: the query plans of the report, timeseries and fleet reads on a 10,000-GPU fleet's tables.

On a database of its own (dropped at the end unless --keep), migrated with the real migrations, it generates in
SQL (generate_series):
  - the fleet: --gpus GPUs on 8-GPU nodes;
  - raw `gpu_samples` for --days UTC days (one partition per day, created by the product's PartitionManager,
    plus the days ahead the beat task pre-creates): every GPU at one sample per --fleet-interval-s, and the
    GPUs of --full-rate-nodes nodes at 1 Hz (the job that is read). 10,000 GPUs x 7 days at 1 Hz is 6 billion
    rows: the disk and time it would take are computed from the measured bytes and rate per row and printed;
  - `gpu_hourly` for every GPU over --history-days (rollups outlive raw samples);
  - back-to-back jobs on every other node over the history, each with a cached report shaped like a real one
    (a characterization of a synthetic 8-GPU job, ~60 KB of JSON);
then VACUUM ANALYZE (what autovacuum does in production; it is off on this machine) and runs the real code paths
-- job report load, job timeseries, fleet summary 24 h / 7 d, fleet timeline 24 h / 7 d -- capturing every
statement they send (server/storage/plans.py), and prints for each: its EXPLAIN (ANALYZE, BUFFERS) execution
time, partitions scanned / total, scan method and index per relation, and buffers.

    .venv/bin/python bench/storage_plans.py [--gpus 10000] [--days 7] [--fleet-interval-s 300]
        [--full-rate-nodes 1] [--history-days 28] [--jobs-per-day 2] [--keep] [--sql]

The selectivity the planner sees differs from a real 1 Hz fleet and is printed: the full-rate GPUs hold a larger
share of each day here (their rows are 1 Hz, the others' are not), which makes an index read of one GPU look
*less* attractive than it would at full scale; the plans below are the pessimistic case.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from bench.scratch import insert_h100_nodes  # noqa: E402
from server.auth.service import Principal  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from server.migrate import upgrade  # noqa: E402
from server.models import Job  # noqa: E402
from server.storage.partitions import DAY_S, PARTITIONS, day_of, partition_name, precreate  # noqa: E402
from server.storage.plans import Catalog, PlanSummary, Statement, capture_statements, explain  # noqa: E402

ADMIN_URL = os.environ.get("FLEETPROF_TEST_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
GPUS_PER_NODE = 8
HOUR_S = 3600
REPORT_JOB = "bench-report-24h"

# Every column an NVML agent fills. `s` = seconds into the day, `g` = gpu id, `busy` = 0/1, `ts` = timestamptz.
SAMPLE_COLUMNS = ("gpu_id, ts, healthy, memory_used_bytes, memory_used_max_bytes, memory_total_bytes, "
                  "memory_reserved_bytes, gpu_util_pct, mem_util_pct, power_w, power_max_w, energy_counter_j, "
                  "temperature_c, sm_clock_mhz, mem_clock_mhz, throttle_reasons, pcie_tx_bytes_per_s, "
                  "pcie_rx_bytes_per_s, nvlink_tx_bytes_per_s, nvlink_rx_bytes_per_s, ecc_corrected_total, "
                  "ecc_uncorrected_total, xid_last")
SAMPLE_VALUES = """g, ts, true,
    (busy * 60e9 + (g * 7919 + s * 104729) % 4000000000)::bigint,
    (busy * 60e9 + (g * 7919 + s * 104729) % 4000000000 + 2e8)::bigint, 85520809984, 502267904,
    busy * (60 + (g * 37 + s * 13) % 40), busy * (20 + (g * 17 + s * 7) % 50),
    70 + busy * (250 + (g * 13 + s * 5) % 400), 700, (extract(epoch from ts) - 1.7e9) * 300 + g * 1000.0,
    35 + busy * (20 + (g + s) % 25), 1980, 2619, 0, busy * 4e9, busy * 4e9, busy * 9e10, busy * 9e10,
    0, 0, 0"""


def sql(conn, statement: str, **params: Any) -> Any:  # type: ignore[no-untyped-def]
    return conn.execute(text(statement), params)


def generate(engine, factory, args: argparse.Namespace, now: float) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Inventory, raw samples, rollups, jobs and reports. Returns counts and timings."""
    out: dict[str, Any] = {}
    n_nodes = args.gpus // GPUS_PER_NODE
    full_gpus = args.full_rate_nodes * GPUS_PER_NODE  # gpu ids 1..full_gpus (the first nodes)
    today = day_of(now)
    days = list(range(today - args.days + 1, today + 1))
    with engine.begin() as conn:
        insert_h100_nodes(conn, n_nodes, GPUS_PER_NODE)
    with session_scope(factory) as session:
        PARTITIONS.ensure(session, days)  # the product's partition creation (ingest / beat)
        precreate(session, now=now)       # and the days ahead the beat task keeps ready

    # Raw samples, hour by hour so that the heap is in time order as ingest writes it. Hours past `now` are cut.
    start = time.perf_counter()
    rows = 0
    for day in days:
        t_day = time.perf_counter()
        for h in range(24):
            h0 = day * DAY_S + h * HOUR_S
            if h0 >= now:
                break
            end = min(HOUR_S, int(now - h0) + 1)
            with engine.begin() as conn:
                # All GPUs not sampled at 1 Hz, at the coarse interval.
                r1 = sql(conn, f"""
                    INSERT INTO gpu_samples ({SAMPLE_COLUMNS})
                    SELECT {SAMPLE_VALUES} FROM (
                      SELECT g, s, to_timestamp(:day0 + s) AS ts, ((g + s / 3600) % 5 <> 0)::int AS busy
                      FROM generate_series(CAST(:h AS bigint), :h + :end - 1, :step) s,
                           generate_series(CAST(:g0 AS bigint), :g1) g) x""",
                         day0=day * DAY_S, h=h * HOUR_S, end=end, step=args.fleet_interval_s, g0=full_gpus + 1,
                         g1=n_nodes * GPUS_PER_NODE).rowcount
                # The full-rate nodes: 1 Hz, a training pattern (busy 4 s out of 6).
                r2 = sql(conn, f"""
                    INSERT INTO gpu_samples ({SAMPLE_COLUMNS})
                    SELECT {SAMPLE_VALUES} FROM (
                      SELECT g, s, to_timestamp(:day0 + s) AS ts, (s % 6 < 4)::int AS busy
                      FROM generate_series(CAST(:h AS bigint), :h + :end - 1) s,
                           generate_series(CAST(1 AS bigint), :g1) g) x""",
                         day0=day * DAY_S, h=h * HOUR_S, end=end, g1=full_gpus).rowcount
                rows += r1 + r2
        print(f"  raw day {partition_name('gpu_samples', day)}: {time.perf_counter() - t_day:.0f} s", flush=True)
    out["raw_rows"], out["raw_insert_s"] = rows, time.perf_counter() - start

    # Hourly rollups over the history, hour-major as the beat task writes them.
    start = time.perf_counter()
    hour_now = int(now // HOUR_S) * HOUR_S
    first_hour = hour_now - (args.history_days * 24 - 1) * HOUR_S
    rollups = 0
    for d0 in range(first_hour, hour_now + 1, DAY_S):
        with engine.begin() as conn:
            rollups += sql(conn, """
                INSERT INTO gpu_hourly (gpu_id, hour, samples, covered_s, busy_s, util_busy_s, energy_j,
                                        memory_peak_bytes, util_mean_pct)
                SELECT g.id, to_timestamp(h), 720, 3600, b * 3600, b * 3600 * 0.8, 3600 * (70 + b * 400),
                       (b * 64e9)::bigint, b * 80
                FROM generate_series(:h0, :h1, 3600) h, gpus g,
                     LATERAL (SELECT ((g.id + h / 3600) % 5 <> 0)::int AS b) busy""",
                           h0=d0, h1=min(d0 + DAY_S - HOUR_S, hour_now)).rowcount
    out["rollup_rows"], out["rollup_insert_s"] = rollups, time.perf_counter() - start

    # Jobs: back to back on every node but the full-rate ones (which run the one 24 h job that is read), each
    # with a report shaped like a real one.
    start = time.perf_counter()
    template = _report_template()
    period = DAY_S // args.jobs_per_day
    t0 = first_hour
    with engine.begin() as conn:
        sql(conn, """
            INSERT INTO jobs (job_id, team, name, state, created_at, updated_at, started_at, ended_at, extra,
                              gpus_requested, node_name)
            SELECT format('fleet-%s-%s', n.id, k), format('team-%s', n.id % 20), format('train-%s', n.id % 300),
                   CASE WHEN e < :now THEN 'finished' ELSE 'running' END, to_timestamp(st), to_timestamp(least(e, :now)),
                   to_timestamp(st), CASE WHEN e < :now THEN to_timestamp(e) END, '{}'::jsonb, 8, n.name
            FROM nodes n, generate_series(0, :k1) k,
                 LATERAL (SELECT CAST(:t0 AS bigint) + k * :period + (n.id * 97) % 3600 AS st) a,
                 LATERAL (SELECT a.st + :period - 300 AS e) b
            WHERE n.id > :full_nodes AND a.st < :now""",
            now=now, t0=t0, period=period, k1=args.history_days * args.jobs_per_day, full_nodes=args.full_rate_nodes)
        sql(conn, "INSERT INTO job_gpus (job_pk, gpu_id, source) SELECT j.id, g.id, 'registered' "
                  "FROM jobs j JOIN nodes n ON n.name = j.node_name JOIN gpus g ON g.node_id = n.id")
        sql(conn, """
            INSERT INTO reports (job_pk, analyzer_version, computed_at, data)
            SELECT j.id, :version, j.updated_at,
                   jsonb_set(jsonb_set(jsonb_set(CAST(:doc AS jsonb), '{job_id}', to_jsonb(j.job_id)),
                                       '{state}', to_jsonb(j.state)), '{team}', to_jsonb(j.team))
            FROM jobs j""", version=template["analyzer_version"], doc=json.dumps(template))
        # The job whose report and timeseries are read: 8 GPUs, 24 h from noon two days ago, across two days.
        started = (today - 2) * DAY_S + 12 * HOUR_S
        job_pk = sql(conn, """
            INSERT INTO jobs (job_id, team, name, state, created_at, updated_at, started_at, ended_at, extra,
                              gpus_requested, node_name)
            VALUES (:job_id, 'team-bench', 'bench', 'finished', to_timestamp(:s), to_timestamp(:e), to_timestamp(:s),
                    to_timestamp(:e), '{}'::jsonb, 8, 'node-00000') RETURNING id""",
                     job_id=REPORT_JOB, s=started, e=started + DAY_S).scalar_one()
        sql(conn, "INSERT INTO job_gpus (job_pk, gpu_id, source) SELECT :pk, id, 'registered' FROM gpus "
                  "WHERE id <= 8", pk=job_pk)
    out["jobs_insert_s"] = time.perf_counter() - start
    return out


def _report_template() -> dict[str, Any]:
    from bench.characterize import synthetic_job
    from server.analysis.characterize import characterize

    job = synthetic_job(hours=1, n_gpus=8)
    return characterize(job, now=job.ended_at + 3600)


def _vacuum_analyze(url: str) -> float:
    start = time.perf_counter()
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("VACUUM (ANALYZE)"))
    engine.dispose()
    return time.perf_counter() - start


def _sizes(engine, now: float) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Measured bytes per raw row (heap and each index of a whole day's partition) and per rollup row."""
    full_day = partition_name("gpu_samples", day_of(now) - 1)
    with engine.connect() as conn:
        n = sql(conn, f"SELECT count(*) FROM {full_day}").scalar_one()
        heap = sql(conn, "SELECT pg_table_size(:t)", t=full_day).scalar_one()
        indexes = dict(sql(conn, "SELECT p.relname, pg_relation_size(c.oid) FROM pg_index x "
                                 "JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_inherits i ON i.inhrelid = c.oid "
                                 "JOIN pg_class p ON p.oid = i.inhparent WHERE x.indrelid = CAST(:t AS regclass)",
                           t=full_day).all())
        raw_total = sql(conn, "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i "
                              "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
                              "WHERE p.relname = 'gpu_samples'").scalar_one()
        counts = {t: sql(conn, f"SELECT count(*) FROM {t}").scalar_one() for t in ("gpu_samples", "gpu_hourly", "jobs")}
        hourly = sql(conn, "SELECT pg_total_relation_size('gpu_hourly')").scalar_one()
        reports = sql(conn, "SELECT pg_total_relation_size('reports')").scalar_one()
        report_doc = sql(conn, "SELECT coalesce(max(length(CAST(data AS text))), 0) FROM "
                               "(SELECT data FROM reports LIMIT 10) r").scalar_one()
        db = sql(conn, "SELECT pg_database_size(current_database())").scalar_one()
    return {"day_rows": n, "heap_b_per_row": heap / n, "index_b_per_row": {k: v / n for k, v in indexes.items()},
            "index_b_per_day": indexes, "raw_total_b": raw_total, "counts": counts,
            "hourly_b_per_row": hourly / max(counts["gpu_hourly"], 1), "hourly_total_b": hourly, "reports_b": reports,
            "report_doc_b": report_doc,
            "db_b": db}


def print_scale(args: argparse.Namespace, gen: dict[str, Any] | None, size: dict[str, Any], n_parts: int) -> None:
    full_gpus = args.full_rate_nodes * GPUS_PER_NODE
    per_day_full = full_gpus * DAY_S
    per_day_coarse = (args.gpus - full_gpus) * (DAY_S // args.fleet_interval_s)
    b_row = size["heap_b_per_row"] + sum(size["index_b_per_row"].values())
    counts = size["counts"]
    took = (lambda key: f", {gen[key]:.0f} s") if gen else (lambda key: "")
    print(f"\nscale{' (reused database: generation figures are those of the run that made it)' if not gen else ''}")
    print(f"  GPUs / nodes                       {args.gpus:,} / {args.gpus // GPUS_PER_NODE:,}")
    print(f"  raw gpu_samples                    {counts['gpu_samples']:,} rows over {args.days} daily partitions "
          f"(+ {n_parts - args.days} pre-created ahead): {args.gpus - full_gpus:,} GPUs every "
          f"{args.fleet_interval_s} s + {full_gpus} GPUs at 1 Hz{took('raw_insert_s')}"
          + (f" ({gen['raw_rows'] / gen['raw_insert_s']:,.0f} rows/s)" if gen else ""))
    print(f"  a full day's partition             {size['day_rows']:,} rows; the 1 Hz GPUs are "
          f"{per_day_full / (per_day_full + per_day_coarse):.1%} of it (one GPU "
          f"{DAY_S / (per_day_full + per_day_coarse):.2%}; at full scale one GPU is {1 / args.gpus:.3%})")
    idx = ", ".join(f"{v:.3g} {k}" for k, v in sorted(size["index_b_per_row"].items()))
    idx_day = ", ".join(f"{k} {v / 2**20:,.1f} MiB" if v >= 2**20 else f"{k} {v / 2**10:,.0f} KiB"
                        for k, v in sorted(size["index_b_per_day"].items()))
    print(f"  bytes per raw row                  {b_row:.0f} = {size['heap_b_per_row']:.0f} heap + {idx}; "
          f"one day: {idx_day}; raw total {size['raw_total_b'] / 2**30:.2f} GiB")
    print(f"  gpu_hourly                         {counts['gpu_hourly']:,} rows ({args.history_days} days), "
          f"{size['hourly_total_b'] / 2**30:.2f} GiB{took('rollup_insert_s')}")
    print(f"  jobs / reports                     {counts['jobs']:,} ({args.jobs_per_day}/node/day), one report "
          f"{size['report_doc_b'] / 1e3:.0f} kB of JSON: {size['reports_b'] / 2**30:.2f} GiB{took('jobs_insert_s')}")
    print(f"  database                           {size['db_b'] / 2**30:.2f} GiB"
          + (f"; VACUUM ANALYZE {gen['vacuum_s']:.0f} s" if gen else ""))
    target_rows = args.gpus * DAY_S * args.days
    rate = f"; at the {gen['raw_rows'] / gen['raw_insert_s']:,.0f} rows/s measured here (one backend), " \
           f"{target_rows / (gen['raw_rows'] / gen['raw_insert_s']) / 3600:,.0f} h to write" if gen else ""
    print(f"\nNOT generated (blocked here): {args.gpus:,} GPUs x {args.days} days at 1 Hz = {target_rows:,} rows "
          f"= {target_rows * b_row / 1e12:.2f} TB at {b_row:.0f} B/row ({args.gpus * DAY_S * b_row / 1e9:.0f} GB "
          f"per daily partition){rate}; disk free here "
          f"{os.statvfs('/').f_bavail * os.statvfs('/').f_frsize / 1e9:.0f} GB")


# ------------------------------------------------------------------------------------------ running and printing

def run_path(session: Session, label: str, call: Callable[[], Any]) -> tuple[float, list[Statement]]:
    """Run one product code path once, capturing what it sends; returns its wall time and the statements."""
    with capture_statements(session) as captured:
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start
    return wall, list(captured)


def _tables_of(plan: PlanSummary) -> str:
    return ", ".join(dict.fromkeys(s.table for s in plan.scans)) or "-"


def describe(plan: PlanSummary, catalog: Catalog) -> list[str]:
    """One line per table read: partitions scanned / total and the scan methods (those that found an empty
    partition, e.g. a day pre-created ahead, marked as such)."""
    lines = []
    for table in dict.fromkeys(s.table for s in plan.scans):
        methods = sorted({f"{s.method}({', '.join(s.indexes)})" if s.indexes else s.method
                          + (" (empty)" if s.empty else "")
                          for s in plan.scans_of(table) if s.executed})
        if table in catalog.partitions:
            scanned = plan.partitions_scanned(table)
            days = ", ".join(sorted(p.rsplit("_p", 1)[1] for p in scanned))
            lines.append(f"{table} {len(scanned)}/{len(catalog.partitions[table])} partitions [{days}]: "
                         f"{'; '.join(methods) or 'pruned'}")
        else:
            lines.append(f"{table}: {'; '.join(methods)}")
    return lines


def report_path(session: Session, catalog: Catalog, label: str, call: Callable[[], Any],
                show_sql: bool) -> dict[str, Any]:
    """Prints the path's plans and returns its figures."""
    wall, statements = run_path(session, label, call)
    exec_ms: list[float | None] = []
    temp_blocks = 0
    print(f"\n{label}\n  product call (first run, incl. Python): {wall * 1000:,.0f} ms, {len(statements)} statements")
    print(f"  {'#':>2} {'exec ms':>9} {'hit/read blocks':>17} {'temp':>6}  relations: partitions, scans")
    for i, stmt in enumerate(statements, 1):
        if not stmt.is_read:
            print(f"  {i:>2} (not a read: {stmt.sql.split()[0]})")
            continue
        plan = explain(session, stmt, catalog=catalog)
        exec_ms.append(plan.execution_ms)
        temp_blocks += plan.temp_blocks
        lines = describe(plan, catalog) or ["(no table)"]
        copy = " [COPY]" if stmt.via_copy else ""
        print(f"  {i:>2} {plan.execution_ms or 0:>9,.1f} {plan.shared_hit_blocks:>8,}/{plan.shared_read_blocks:<8,}"
              f" {plan.temp_blocks:>6,}  {lines[0]}{copy}")
        for line in lines[1:]:
            print(f"  {'':>2} {'':>9} {'':>17} {'':>6}  {line}")
        if show_sql:
            print("      " + re.sub(r"\s+", " ", stmt.query)[:600] + (f"   -- {stmt.params}" if stmt.params else ""))
    return {"product_call_ms": wall * 1000, "statements_count": len(statements), "reads_exec_ms": exec_ms,
            "temp_blocks_count": temp_blocks}


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=7, help="days of raw samples (>= 3)")
    parser.add_argument("--fleet-interval-s", type=int, default=300, help="raw sample interval of most GPUs")
    parser.add_argument("--full-rate-nodes", type=int, default=1, help="nodes whose 8 GPUs are sampled at 1 Hz")
    parser.add_argument("--history-days", type=int, default=28, help="days of hourly rollups and jobs")
    parser.add_argument("--jobs-per-day", type=int, default=2, help="jobs per node per day")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    parser.add_argument("--reuse", metavar="DB", help="a database kept by an earlier run (same scale arguments): "
                        "migrate it to head and measure again, no generation; kept")
    parser.add_argument("--drop-index", action="append", default=[], metavar="NAME",
                        help="measure without this index (dropped in the measuring transaction, rolled back): "
                             "the plans before a migration that added it")
    parser.add_argument("--sql", action="store_true", help="print each statement's SQL")
    args = parser.parse_args()
    if args.days < 3:
        parser.error("--days must be at least 3 (the 24 h job spans the two days before today)")

    db = args.reuse or f"fleetprof_bench_plans_{os.getpid()}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    if not args.reuse:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{db}"'))
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{db}"
    print(f"database {db}; load before: {_uptime()}")
    try:
        settings = ServerSettings(database_url=url)
        start = time.perf_counter()
        upgrade(settings)  # the real migrations; on a reused database, those added since it was made
        print(f"migrations to head: {time.perf_counter() - start:.1f} s")
        engine = make_engine(settings)
        factory = make_sessionmaker(engine)
        gen: dict[str, Any] | None = None
        if args.reuse:
            with engine.connect() as conn:  # the data's clock: its last sample
                now = sql(conn, "SELECT extract(epoch FROM max(ts))::float8 + 1 FROM gpu_samples").scalar_one()
        else:
            now = time.time()
            gen = generate(engine, factory, args, now)
            gen["vacuum_s"] = _vacuum_analyze(url)
        with factory() as session:
            n_parts = len(Catalog.load(session).partitions["gpu_samples"])
        print_scale(args, gen, _sizes(engine, now), n_parts)
        paths = run_paths(factory, settings, now, args.sql, args.drop_index)
        engine.dispose()
        print(f"\npeak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB; "
              f"load after: {_uptime()}")
        write_report(__file__, {
            "gpus_count": args.gpus, "days_count": args.days, "gpu_samples_partitions_count": n_parts,
            "dropped_indexes": args.drop_index, "paths": paths,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 2**10})  # ru_maxrss is in KiB
        return 0
    finally:
        if args.keep or args.reuse:
            print(f"kept database {db}")
        else:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()


def run_paths(factory, settings: ServerSettings, now: float, show_sql: bool,  # type: ignore[no-untyped-def]
              drop_indexes: list[str]) -> dict[str, dict[str, Any]]:
    from server.fleet import service as fleet_service
    from server.fleet.dashboard_router import fleet_timeline
    from server.fleet.router import parse_window
    from server.jobs import loader
    from server.jobs.router import get_timeseries

    operator = Principal(token_id=0, scope="operator")
    session = factory()
    for name in drop_indexes:  # transactional DDL: the rollback at the end puts it back
        session.execute(text(f'DROP INDEX "{name}"'))
        print(f"\nindex {name} dropped for this measurement (rolled back after)")
    catalog = Catalog.load(session)
    job = session.query(Job).filter_by(job_id=REPORT_JOB).one()
    span = " -> ".join(f"{t:%Y-%m-%d %H:%M}" for t in (job.started_at, job.ended_at))
    paths: list[tuple[str, Callable[[], Any]]] = [
        (f"(a) job report load: 8 GPUs x 24 h at 1 Hz ({span} UTC), loader.load_job_data",
         lambda: loader.load_job_data(session, job, settings, now=time.time())),
        ("(b) job timeseries, gpu_util_pct, 1000 points per GPU (GET /jobs/{id}/timeseries)",
         lambda: get_timeseries(REPORT_JOB, operator, session, metric="gpu_util_pct", points=1000, since=None,
                                until=None)),
        ("(c1) fleet summary 24 h (GET /fleet/summary?window=24h)",
         lambda: fleet_service.summary(session, window_s=parse_window("24h"), now=now)),
        ("(c2) fleet summary 7 d (GET /fleet/summary?window=7d)",
         lambda: fleet_service.summary(session, window_s=parse_window("7d"), now=now)),
        ("(d1) fleet timeline / heatmap 24 h (GET /fleet/timeline?window=24h)",
         lambda: fleet_timeline(operator, session, window="24h")),
        ("(d2) fleet timeline / heatmap 7 d (GET /fleet/timeline?window=7d)",
         lambda: fleet_timeline(operator, session, window="7d")),
        # Its writes are rolled back below.
        ("(e) rollup sweep, the beat task every 5 min: rollup_hours over the last 2 h (writes rolled back)",
         lambda: fleet_service.rollup_hours(session, since=now - 2 * HOUR_S, until=now, now=now)),
    ]
    print("\nplans: EXPLAIN (ANALYZE, BUFFERS) of each captured read, run right after the product call (so mostly "
          "cached); blocks of 8 KiB, shared hit / read; temp = blocks spilled to disk. EXPLAIN ANALYZE does not "
          "detoast or send the rows: the product call's time includes that and the Python work")
    figures = {label: report_path(session, catalog, label, call, show_sql) for label, call in paths}
    session.rollback()
    session.close()
    return figures


if __name__ == "__main__":
    sys.exit(main())
