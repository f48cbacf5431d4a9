"""Plot views: a finished job's series at the fine bucket grid, stored with its final report, so that its page's
unzoomed plots merge ~4,096 buckets per GPU instead of scanning every sample (8 GPUs x 24 h at 1 Hz: 691,200
rows per view).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 08:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import server.models.base

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plot_views",
        sa.Column("job_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("computed_at", server.models.base.UtcDateTime(timezone=True), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["job_pk"], ["jobs.id"], name=op.f("fk_plot_views_job_pk_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_pk", name=op.f("pk_plot_views")),
    )


def downgrade() -> None:
    op.drop_table("plot_views")
