"""Goodput in the hourly rollups (issue #20): each hour's util-known time split into idle, input-stalled, throttled
and productive seconds (server.analysis.fleet.goodput), and the seconds under each slowdown clock-event reason (the
fleet's GPUs needing attention), per GPU and per job share of a GPU.

Nullable columns without defaults: rows rolled up before stay null (their time counts as unknown goodput) until
their hours are rolled up again.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 21:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLES = ("gpu_hourly", "gpu_job_hourly")
COLUMNS = ("idle_s", "stalled_s", "throttled_s", "productive_s", "thermal_s", "power_cap_s", "hw_slowdown_s")


def upgrade() -> None:
    for table in TABLES:
        for name in COLUMNS:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        for name in reversed(COLUMNS):
            op.drop_column(table, name)
