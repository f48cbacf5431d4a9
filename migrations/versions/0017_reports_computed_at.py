"""`reports.computed_at` indexed: the newest stored report is one index probe. It versions what the projections
derive from every stored report (server/jobs/projection.py, the other models' pairs), asked on each projection and
right-sizing request.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26 01:00:00
"""
from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_reports_computed_at", "reports", ["computed_at"])


def downgrade() -> None:
    op.drop_index("ix_reports_computed_at", table_name="reports")
