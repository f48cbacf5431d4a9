"""Rollups carry the fleet analyzer's fields (covered/busy seconds, energy, memory peak).

Rollups are derived data: they are cleared here and rebuilt by the periodic rollup task.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 02:36:51.941593
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM gpu_hourly")
    with op.batch_alter_table("gpu_hourly") as batch:
        batch.add_column(sa.Column("covered_s", sa.Float(), nullable=False))
        batch.add_column(sa.Column("busy_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("util_busy_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("memory_peak_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("util_mean_pct", sa.Float(), nullable=True))
        batch.drop_column("gpu_util_mean_pct")
        batch.drop_column("power_mean_w")
        batch.drop_column("memory_used_mean_bytes")
        batch.drop_column("memory_used_max_bytes")
        batch.drop_column("busy_samples")
    op.create_index("ix_gpu_hourly_hour", "gpu_hourly", ["hour"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_gpu_hourly_hour", table_name="gpu_hourly")
    op.execute("DELETE FROM gpu_hourly")
    with op.batch_alter_table("gpu_hourly") as batch:
        batch.add_column(sa.Column("busy_samples", sa.Integer(), nullable=False))
        batch.add_column(sa.Column("memory_used_max_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("memory_used_mean_bytes", sa.Float(), nullable=True))
        batch.add_column(sa.Column("power_mean_w", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gpu_util_mean_pct", sa.Float(), nullable=True))
        batch.drop_column("util_mean_pct")
        batch.drop_column("memory_peak_bytes")
        batch.drop_column("util_busy_s")
        batch.drop_column("busy_s")
        batch.drop_column("covered_s")
