"""Migrations: upgrade/downgrade round trip on Postgres and SQLite, and no drift between models and migrations."""

from __future__ import annotations

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
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models differ from migrations (write a migration): {diff}"
