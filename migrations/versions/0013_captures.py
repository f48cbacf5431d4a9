"""Live captures (issue #19): a Kineto trace or allocator history of K steps of a running job, requested over REST
or by the server on a step-time regression, carried out by the hooks; the state machine keeps each state's time.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 10:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import server.models.base

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, server.models.base.UtcDateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "captures",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("capture_id", sa.String(length=40), nullable=False),
        sa.Column("job_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("ranks", _json(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=2000), nullable=True),
        sa.Column("trigger", _json(), nullable=False),
        sa.Column("trigger_kind", sa.String(length=32), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=True),
        _ts("requested_at", nullable=False), _ts("delivered_at"), _ts("capturing_at"), _ts("uploaded_at"),
        _ts("analyzed_at"), _ts("failed_at"),
        sa.Column("trace_ids", _json(), nullable=False),
        sa.Column("delivered_ranks", _json(), nullable=False),
        sa.ForeignKeyConstraint(["job_pk"], ["jobs.id"], name=op.f("fk_captures_job_pk_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_captures")),
        sa.UniqueConstraint("capture_id", name=op.f("uq_captures_capture_id")),
    )
    op.create_index(op.f("ix_captures_job_pk"), "captures", ["job_pk"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_captures_job_pk"), table_name="captures")
    op.drop_table("captures")
