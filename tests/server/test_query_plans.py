"""Query plans of the report, timeseries and fleet reads: only the partitions of the window are read, through the
intended index. The statements are captured from the real code paths (server/storage/plans.py) and EXPLAINed
(ANALYZE, FORMAT JSON); the figures at 10,000 GPUs are bench/storage_plans.py's (docs/ARCHITECTURE.md).

The data is small but shaped so that the planner would choose otherwise if an index or pruning were lost: 512
GPUs over four daily partitions (plus the two the beat task pre-creates), one GPU = 0.2 % of a day, and 60 days
of hourly rollups, of which 24 h is under 2 %.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from server.auth.service import Principal
from server.config import ServerSettings
from server.db import make_engine, make_sessionmaker, session_scope
from server.storage.partitions import DAY_S, PARTITIONS, day_of, list_partitions, precreate
from server.storage.plans import INDEX_SCANS, Catalog, PlanSummary, Statement, capture_statements, explain
from tests.conftest import _truncate_all

NODES, GPUS_PER_NODE = 64, 8
RAW_DAYS = 4
INTERVAL_S = 600
ROLLUP_DAYS = 60
HOUR_S = 3600
JOB_ID = "plans-24h"


@dataclass
class Fleet:
    session: Session
    settings: ServerSettings
    catalog: Catalog
    now: float
    job_window: tuple[float, float]


def _generate(url: str, now: float) -> tuple[float, float]:
    """Inventory, raw samples (time-major, as ingest writes), rollups, and one 8-GPU job of 24 h across two days."""
    today = day_of(now)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name, dropped_samples_total, created_at) "
                          "SELECT 'plans-' || n, 0, now() FROM generate_series(1, :n) n"), {"n": NODES})
        conn.execute(text("INSERT INTO gpus (node_id, uuid, index, name, healthy) SELECT n.id, "
                          "'GPU-' || n.id || '-' || i, i, 'H100', true FROM nodes n, generate_series(0, :k) i "
                          "ORDER BY n.id, i"), {"k": GPUS_PER_NODE - 1})
    with session_scope(make_sessionmaker(engine)) as session:
        PARTITIONS.ensure(session, range(today - RAW_DAYS + 1, today + 1))
        precreate(session, now=now)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO gpu_samples (gpu_id, ts, memory_used_bytes, gpu_util_pct, power_w, energy_counter_j, "
            "temperature_c, sm_clock_mhz) "
            "SELECT g.id, to_timestamp(t), 4e10 + (g.id * 7919 + t) % 1e9, (g.id + t / 600) % 101, 300, t - 1.7e9, 50, "
            "1980 FROM generate_series(CAST(:t0 AS bigint), :t1, :step) t, gpus g ORDER BY t, g.id"),
            {"t0": (today - RAW_DAYS + 1) * DAY_S, "t1": int(now), "step": INTERVAL_S})
        h1 = int(now // HOUR_S) * HOUR_S
        conn.execute(text(
            "INSERT INTO gpu_hourly (gpu_id, hour, samples, covered_s, busy_s, util_busy_s, energy_j, "
            "memory_peak_bytes, util_mean_pct) SELECT g.id, to_timestamp(h), 6, 3600, 1800, 1500, 1e6, 4e10, 42 "
            "FROM generate_series(CAST(:h0 AS bigint), :h1, 3600) h, gpus g ORDER BY h, g.id"),
            {"h0": h1 - (ROLLUP_DAYS * 24 - 1) * HOUR_S, "h1": h1})
        start = (today - 2) * DAY_S + 12 * HOUR_S
        job_pk = conn.execute(text(
            "INSERT INTO jobs (job_id, state, created_at, updated_at, started_at, ended_at, extra) VALUES "
            "(:j, 'finished', to_timestamp(:s), to_timestamp(:e), to_timestamp(:s), to_timestamp(:e), '{}') "
            "RETURNING id"), {"j": JOB_ID, "s": start, "e": start + DAY_S}).scalar_one()
        conn.execute(text("INSERT INTO job_gpus (job_pk, gpu_id, source) SELECT :pk, id, 'registered' FROM gpus "
                          "WHERE node_id = (SELECT min(id) FROM nodes)"), {"pk": job_pk})
    with create_engine(url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("VACUUM (ANALYZE) gpu_samples, gpu_hourly, gpus, nodes, jobs, job_gpus"))
    engine.dispose()
    return start, start + DAY_S


@pytest.fixture(scope="module")
def fleet(pg_url, pg_engine, tmp_path_factory) -> Iterator[Fleet]:
    _truncate_all(pg_engine)
    now = time.time()
    job_window = _generate(pg_url, now)
    settings = ServerSettings(database_url=pg_url, broker_url=None, data_dir=tmp_path_factory.mktemp("plans"))
    engine = make_engine(settings)
    session = make_sessionmaker(engine)()
    try:
        yield Fleet(session=session, settings=settings, catalog=Catalog.load(session), now=now, job_window=job_window)
    finally:
        session.close()
        engine.dispose()
        _truncate_all(pg_engine)


def _plans(fleet: Fleet, call: Callable[[], Any]) -> list[tuple[Statement, PlanSummary]]:
    with capture_statements(fleet.session) as captured:
        call()
    out = [(s, explain(fleet.session, s, catalog=fleet.catalog)) for s in captured if s.is_read]
    fleet.session.rollback()
    return out


def _days_overlapping(session: Session, table: str, lo: float, hi: float | None) -> set[str]:
    return {name for name, day in list_partitions(session, table)
            if day * DAY_S <= (hi if hi is not None else float("inf")) and (day + 1) * DAY_S > lo}


PK_BY_GPU = {"pk_gpu_samples": "gpu_id"}
LATEST = {"pk_gpu_samples": "gpu_id", "ix_gpu_samples_ts": "ts"}


def check_read(plan: PlanSummary, fleet: Fleet, table: str, lo: float, hi: float | None,
               indexes: dict[str, str]) -> None:
    """`table` is read only in its partitions overlapping [lo, hi] (hi None: no upper bound), and every scan of
    it is an index scan on one of `indexes` entered by that index's leading column (name -> leading column): a
    scan whose condition is only on a later column would read the whole index. An empty partition (the days
    pre-created ahead) is read however the planner likes: it costs nothing."""
    scans = [s for s in plan.scans_of(table) if s.executed and not s.empty]
    assert scans, f"{table} is not read: {plan.scans}"
    if table in fleet.catalog.partitions:
        scanned = plan.partitions_scanned(table)
        relevant = _days_overlapping(fleet.session, table, lo, hi)
        assert scanned and scanned <= relevant, (
            f"{table}: scanned {sorted(scanned)}, only {sorted(relevant)} hold the window "
            f"({len(fleet.catalog.partitions[table])} partitions)")
    for scan in scans:
        leading = indexes.get(scan.indexes[0]) if len(scan.indexes) == 1 else None
        assert scan.method in INDEX_SCANS and leading is not None, (
            f"{scan.relation} read by {scan.method} {scan.indexes}, expected an index scan on {sorted(indexes)}")
        assert re.search(rf"\({leading} (=|<|>|<=|>=) ", scan.index_cond or ""), (
            f"{scan.relation}: {scan.indexes[0]} entered by {scan.index_cond!r}, not by {leading}")


def _reads_of(plans: list[tuple[Statement, PlanSummary]], table: str) -> list[PlanSummary]:
    return [p for _, p in plans if p.scans_of(table)]


def _job(fleet: Fleet):  # type: ignore[no-untyped-def]
    from server.models import Job

    return fleet.session.query(Job).filter_by(job_id=JOB_ID).one()


def test_report_load_reads_the_jobs_two_days_by_primary_key(fleet):
    from server.jobs import loader

    job = _job(fleet)
    plans = _plans(fleet, lambda: loader.load_job_data(fleet.session, job, fleet.settings, now=fleet.now))
    reads = _reads_of(plans, "gpu_samples")
    assert len(reads) == GPUS_PER_NODE  # one COPY per GPU
    for plan in reads:
        check_read(plan, fleet, "gpu_samples", *fleet.job_window, PK_BY_GPU)
        assert len(plan.partitions_scanned("gpu_samples")) == 2  # noon to noon: two days of the four


def test_timeseries_reads_the_jobs_two_days_by_primary_key(fleet):
    from server.jobs.router import get_timeseries

    plans = _plans(fleet, lambda: get_timeseries(JOB_ID, Principal(token_id=0, scope="operator"), fleet.session,
                                                 metric="power_w", points=50, since=None, until=None))
    reads = _reads_of(plans, "gpu_samples")
    assert len(reads) >= GPUS_PER_NODE
    for plan in reads:
        check_read(plan, fleet, "gpu_samples", *fleet.job_window, PK_BY_GPU)


@pytest.mark.parametrize("window", ["24h", "7d"])
def test_fleet_summary_reads_the_window_of_rollups_and_the_current_day(fleet, window):
    from server.fleet import service as fleet_service
    from server.fleet.router import parse_window

    window_s = parse_window(window)
    plans = _plans(fleet, lambda: fleet_service.summary(fleet.session, window_s=window_s, now=fleet.now))
    # The rollup sums (by hour) and the GPUs with rollups in the window (one primary-key probe per GPU).
    from server.nodes.attention import ATTENTION_WINDOW_S

    # ... and the GPUs needing attention's slowdown seconds (the hours of the last hour).
    rollups = _reads_of(plans, "gpu_hourly")
    assert len(rollups) == 3
    for plan in rollups:
        check_read(plan, fleet, "gpu_hourly", fleet.now - window_s - HOUR_S, None,
                   {"ix_gpu_hourly_hour": "hour", "pk_gpu_hourly": "gpu_id"})
    # Each GPU's current utilization (within 5 minutes of now), and its first and last sample of the attention
    # window (XIDs, error counters): primary-key probes per GPU, never a scan of the window's samples.
    reads = _reads_of(plans, "gpu_samples")
    assert len(reads) == 2

    def fits(latest: PlanSummary, probes: PlanSummary) -> bool:  # the reads run on threads: either order
        try:
            check_read(latest, fleet, "gpu_samples", fleet.now - fleet_service.CURRENT_WINDOW_S,
                       fleet.now + fleet_service.CURRENT_WINDOW_S, LATEST)
            check_read(probes, fleet, "gpu_samples", fleet.now - ATTENTION_WINDOW_S, fleet.now, LATEST)
        except AssertionError:
            return False
        return True

    assert fits(*reads) or fits(*reversed(reads)), [p.scans for p in reads]


@pytest.mark.parametrize("window", ["24h", "7d"])
def test_fleet_timeline_reads_the_window_of_rollups(fleet, window):
    from server.fleet.dashboard_router import fleet_timeline

    plans = _plans(fleet, lambda: fleet_timeline(Principal(token_id=0, scope="operator"), fleet.session,
                                                 window=window))
    (rollups,) = _reads_of(plans, "gpu_hourly")
    check_read(rollups, fleet, "gpu_hourly", 0, None, {"ix_gpu_hourly_hour": "hour"})


# The check itself must be able to fail: the report's own statement, rewritten the two ways a query change could
# silently lose what this file guards.
DEFEATS = {
    "ts wrapped in a function: no pruning": (r"gpu_samples\.ts (>=|<=)", r"date_trunc('second', gpu_samples.ts) \1"),
    "gpu_id in an expression: no index": (r"gpu_samples\.gpu_id = ", r"gpu_samples.gpu_id + 0 = "),
}


@pytest.mark.parametrize("defeat", DEFEATS)
def test_the_check_fails_on_a_query_that_defeats_pruning_or_the_index(fleet, defeat):
    from server.jobs import loader

    job = _job(fleet)
    with capture_statements(fleet.session) as captured:
        loader.load_job_data(fleet.session, job, fleet.settings, now=fleet.now)
    stmt = next(s for s in captured if s.via_copy)
    pattern, replacement = DEFEATS[defeat]
    changed, n = re.subn(pattern, replacement, stmt.sql)
    assert n
    plan = explain(fleet.session, Statement(sql=changed, via_copy=True), catalog=fleet.catalog)
    fleet.session.rollback()
    with pytest.raises(AssertionError):
        check_read(plan, fleet, "gpu_samples", *fleet.job_window, PK_BY_GPU)
