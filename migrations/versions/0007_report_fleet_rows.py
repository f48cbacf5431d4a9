"""Reports carry the few figures the fleet summary needs (`fleet_row`) beside the whole document.

The summary read every report document of the window (~60 kB of JSON each, decompressed by Postgres): 11.7 s at
70,000 jobs (bench/storage_plans.py). Existing rows keep `fleet_row` null; the summary derives theirs from the
document (the same function) until their next characterization.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 07:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reports") as batch:
        batch.add_column(sa.Column("fleet_row", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reports") as batch:
        batch.drop_column("fleet_row")
