"""Daily partitions: created by ingest, pruned by the report/timeseries queries, dropped by retention."""

from __future__ import annotations

import time

from sqlalchemy import text

from server.db import make_engine, make_sessionmaker, session_scope
from server.fleet.service import rollup_hours
from server.storage.partitions import DAY_S, apply_retention, day_of, list_partitions, partition_name
from tests.server.helpers import auth, sample_batch


def test_ingest_creates_days_queries_prune_and_retention_drops(api, make_token, server_settings, db_session):
    agent, op = make_token("agent", node="node-a"), make_token("operator")
    now = time.time()
    today = day_of(now)
    days = [today - 20, today - 1, today]
    for seq, day in enumerate(days):
        batch = sample_batch(seq=seq, n=30, gpus=1, t0=day * DAY_S + 3600)
        assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    db_session.rollback()
    names = {name for name, _ in list_partitions(db_session, "gpu_samples")}
    assert {partition_name("gpu_samples", d) for d in days} <= names

    # A job window inside one day touches that day's partition only, through the primary-key index.
    start, end = today * DAY_S + 3600, today * DAY_S + 3629
    plan = "\n".join(db_session.execute(text(
        "EXPLAIN SELECT ts, power_w FROM gpu_samples WHERE gpu_id = 1 AND ts >= to_timestamp(:a) "
        "AND ts <= to_timestamp(:b) ORDER BY ts"), {"a": start, "b": end}).scalars())
    assert partition_name("gpu_samples", today) in plan
    assert partition_name("gpu_samples", today - 1) not in plan and partition_name("gpu_samples", today - 20) not in plan
    assert "Index" in plan  # the primary key (gpu_id, ts) serves the range read
    db_session.rollback()

    engine = make_engine(server_settings)
    factory = make_sessionmaker(engine)
    with session_scope(factory) as session:
        # to the end of today: today's samples sit at 01:00 UTC, after `now` in the day's first hour
        rollup_hours(session, since=(today - 20) * DAY_S, until=(today + 1) * DAY_S)
    with session_scope(factory) as session:
        dropped = apply_retention(session, now=now, raw_retention_days=14)
    assert partition_name("gpu_samples", today - 20) in dropped
    assert partition_name("gpu_samples", today - 1) not in dropped
    with engine.connect() as conn:
        raw_days = conn.execute(text("SELECT count(DISTINCT date_trunc('day', ts)) FROM gpu_samples")).scalar()
        rollup_days = conn.execute(text("SELECT count(DISTINCT date_trunc('day', hour)) FROM gpu_hourly")).scalar()
    assert raw_days == 2 and rollup_days == 3  # raw samples expire, rollups are kept

    # Late data for a dropped day recreates its partition instead of failing.
    late = sample_batch(seq=9, n=5, gpus=1, t0=(today - 20) * DAY_S + 7200)
    assert api.post("/api/v1/ingest/samples", json=late, headers=auth(agent)).status_code == 200
    engine.dispose()
    assert op


def test_retention_gives_way_to_a_reader_instead_of_stalling_ingest(api, make_token, server_settings):
    agent = make_token("agent", node="node-a")
    now = time.time()
    old = day_of(now) - 30
    assert api.post("/api/v1/ingest/samples", json=sample_batch(n=5, gpus=1, t0=old * DAY_S + 60),
                    headers=auth(agent)).status_code == 200
    engine = make_engine(server_settings)
    reader = engine.connect()
    reader.execute(text("BEGIN"))
    reader.execute(text("SELECT count(*) FROM gpu_samples"))  # a long report query holds the parent
    try:
        start = time.monotonic()
        with session_scope(make_sessionmaker(engine)) as session:
            dropped = apply_retention(session, now=now, raw_retention_days=14)
        assert partition_name("gpu_samples", old) not in dropped
        assert time.monotonic() - start < 30  # gave up after the lock timeout, did not queue
    finally:
        reader.rollback()
        reader.close()
    with session_scope(make_sessionmaker(engine)) as session:
        assert partition_name("gpu_samples", old) in apply_retention(session, now=now, raw_retention_days=14)
    engine.dispose()
