"""A job's model fingerprint (issue #21): `jobs.fingerprint`, indexed, for `GET /api/v1/jobs?fingerprint=` and the
characterization across configurations. Filled from the hooks' framework_info event (fleetprof/fingerprint.py);
null for jobs without hooks or from before fingerprints.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 21:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("fingerprint", sa.String(length=64), nullable=True))
    op.create_index("ix_jobs_fingerprint", "jobs", ["fingerprint"])


def downgrade() -> None:
    op.drop_index("ix_jobs_fingerprint", table_name="jobs")
    op.drop_column("jobs", "fingerprint")
