"""Partition the raw sample tables by day (Postgres): gpu_samples and process_samples become
`PARTITION BY RANGE (ts)` with one partition per UTC day; existing rows are moved into their days.

SQLite (embedded mode) has no partitioning: nothing changes there.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 03:20:00
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone  # noqa: F401 - datetime: the type of _days()

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# table -> (primary key columns, extra indexes as (name, columns))
TABLES = {
    "gpu_samples": ("gpu_id, ts", []),
    "process_samples": ("gpu_id, ts, pid", [("ix_process_samples_job_ts", "job_id, ts")]),
}


def _days(table: str) -> list[datetime]:
    rows = op.get_bind().exec_driver_sql(
        f"SELECT DISTINCT date_trunc('day', ts AT TIME ZONE 'UTC') FROM {table}_old").fetchall()
    return [r[0].replace(tzinfo=UTC) for r in rows]


def _rebuild(table: str, pk: str, indexes: list[tuple[str, str]], *, partitioned: bool) -> None:
    op.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
    op.execute(f"ALTER TABLE {table}_old RENAME CONSTRAINT pk_{table} TO pk_{table}_old")
    op.execute(f"ALTER TABLE {table}_old RENAME CONSTRAINT fk_{table}_gpu_id_gpus TO fk_{table}_gpu_id_gpus_old")
    for name, _ in indexes:
        op.execute(f"ALTER INDEX {name} RENAME TO {name}_old")
    suffix = " PARTITION BY RANGE (ts)" if partitioned else ""
    op.execute(f"CREATE TABLE {table} (LIKE {table}_old INCLUDING DEFAULTS){suffix}")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({pk})")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_gpu_id_gpus FOREIGN KEY (gpu_id) "
               f"REFERENCES gpus (id) ON DELETE CASCADE")
    for name, cols in indexes:
        op.execute(f"CREATE INDEX {name} ON {table} ({cols})")
    if partitioned:
        for day in _days(table):
            op.execute(f"CREATE TABLE {table}_p{day:%Y%m%d} PARTITION OF {table} FOR VALUES FROM "
                       f"('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')")
    op.execute(f"INSERT INTO {table} SELECT * FROM {table}_old")
    op.execute(f"DROP TABLE {table}_old CASCADE")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, (pk, indexes) in TABLES.items():
        _rebuild(table, pk, indexes, partitioned=True)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, (pk, indexes) in TABLES.items():
        _rebuild(table, pk, indexes, partitioned=False)

