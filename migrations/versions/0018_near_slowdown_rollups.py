"""Seconds a GPU ran within a few degrees of its slowdown temperature, per hour, in the rollups (issue #20): the
fleet's "GPUs needing attention" list reads them as it reads the slowdown clock-event seconds, so a GPU running hot
is listed before it throttles (server.analysis.health.findings.TEMPERATURE_MARGIN_C).

A nullable column without a default: rows rolled up before stay null (unknown) until their hours are rolled up
again.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 04:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

TABLES = ("gpu_hourly", "gpu_job_hourly")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("near_slowdown_s", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "near_slowdown_s")
