"""Migrations: upgrade/downgrade round trip on Postgres and SQLite, and no drift between models and migrations."""

from __future__ import annotations

import re

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from server.config import ServerSettings
from server.migrate import downgrade, upgrade
from server.models import Base
from tests.conftest import PG_ADMIN_URL, SESSION_TAG


def _fresh_pg(suffix: str) -> tuple[str, object]:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fleetprof_mig_{SESSION_TAG}_{suffix}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}", admin


def _drop(admin, url: str) -> None:  # type: ignore[no-untyped-def]
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    admin.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_round_trip_postgres():
    url, admin = _fresh_pg("rt")
    try:
        settings = ServerSettings(database_url=url)
        upgrade(settings)
        assert _tables(url) == set(Base.metadata.tables)
        downgrade(settings, "base")
        assert _tables(url) == set()
        upgrade(settings)
        assert _tables(url) == set(Base.metadata.tables)
    finally:
        _drop(admin, url)


def test_round_trip_sqlite(tmp_path):
    settings = ServerSettings(data_dir=tmp_path)
    upgrade(settings)
    assert _tables(settings.sqlalchemy_url) == set(Base.metadata.tables)
    downgrade(settings, "base")
    assert _tables(settings.sqlalchemy_url) == set()
    upgrade(settings)
    assert _tables(settings.sqlalchemy_url) == set(Base.metadata.tables)


def test_models_and_migrations_do_not_drift(pg_url):
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            # daily partitions are created at run time, not by migrations
            ctx = MigrationContext.configure(conn, opts={
                "compare_type": True,
                "include_name": lambda name, type_, _: not (type_ == "table" and re.search(r"_p\d{8}$", name or ""))})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models differ from migrations (write a migration): {diff}"


def test_partitioning_migration_keeps_the_data():
    """0002 -> 0003 moves existing rows into daily partitions; 0003 -> 0002 moves them back."""
    url, admin = _fresh_pg("part")
    try:
        settings = ServerSettings(database_url=url)
        upgrade(settings, "0002")
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO nodes (name, dropped_samples_total, created_at) VALUES ('n', 0, now())"))
            conn.execute(text("INSERT INTO gpus (node_id, uuid, index, name, healthy) VALUES (1, 'G', 0, 'H100', true)"))
            conn.execute(text("INSERT INTO gpu_samples (gpu_id, ts, power_w) SELECT 1, "
                              "timestamptz '2026-11-01 00:00:00+00' + i * interval '1 hour', i "
                              "FROM generate_series(0, 71) i"))
        upgrade(settings, "0003")
        with engine.connect() as conn:
            parts = conn.execute(text("SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
                                      "WHERE p.relname = 'gpu_samples'")).scalar()
            total = conn.execute(text("SELECT count(*), sum(power_w) FROM gpu_samples")).one()
        assert parts == 3 and tuple(total) == (72, sum(range(72)))
        downgrade(settings, "0002")
        with engine.connect() as conn:
            assert tuple(conn.execute(text("SELECT count(*), sum(power_w) FROM gpu_samples")).one()) == (72, sum(range(72)))
        engine.dispose()
    finally:
        _drop(admin, url)
