"""Rollup backlog: hours of a GPU range that received samples after the periodic rollup sweep (the last 2 hours)
had passed them, e.g. an agent replaying hours of spool after an outage. Without it those samples stayed out of
the hourly rollups, and so out of every fleet figure, for good.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 09:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import server.models.base

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollup_backlog",
        sa.Column("range_k", sa.Integer(), nullable=False),
        sa.Column("hour", server.models.base.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("range_k", "hour", name=op.f("pk_rollup_backlog")),
    )


def downgrade() -> None:
    op.drop_table("rollup_backlog")
