"""Every GPU sample carries the enforced power limit (W) and the application clocks (MHz): a job's power cap is
known from its own samples (power-cap right-sizing needs it), even when the limit changed during the job.

Nullable columns without defaults: adding them to the partitioned table (and its partitions) rewrites nothing.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 15:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

COLUMNS = ("power_limit_w", "app_sm_clock_mhz", "app_mem_clock_mhz")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("gpu_samples", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("gpu_samples", name)
