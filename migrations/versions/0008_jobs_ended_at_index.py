"""An index on jobs.ended_at: the fleet summary's job rows, the headroom view and the rollup sweep's job windows
all select "running, or ended since T" (`ended_at IS NULL OR ended_at >= T`), which was a sequential scan of every
job ever recorded (~40 ms at 70,000 jobs, bench/storage_plans.py, growing with history). With the index the
planner ORs two index conditions and reads only the window's jobs.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 09:00:00
"""
from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_ended_at", "jobs", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_ended_at", table_name="jobs")
