"""Raw sample tables lose their foreign key to `gpus`.

A foreign key is checked row by row (a trigger and a lookup per sample): measured on the partitioned
`gpu_samples`, ~5.5 us per row, more than the write itself (binary COPY ~2.7 us). The collector takes GPU ids
only from the inventory it has just upserted, GPUs are never deleted (a retired GPU keeps its history until
retention drops its days), so the check bought nothing at ingest's rate. Rollups and job links keep theirs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 07:00:00
"""
from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("gpu_samples", "process_samples")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:  # SQLite: a table rebuild; Postgres: ALTER TABLE
            batch.drop_constraint(f"fk_{table}_gpu_id_gpus", type_="foreignkey")


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.create_foreign_key(f"fk_{table}_gpu_id_gpus", "gpus", ["gpu_id"], ["id"], ondelete="CASCADE")
