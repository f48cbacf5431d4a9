"""Registered models: the model factories an operator allowed pre-training estimates to import
(`fleetprof models add module:function`). A request names no code of its own: only these and the built-in zoo.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 12:10:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import server.models.base

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registered_models",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("factory", sa.String(length=200), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column("created_at", server.models.base.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registered_models")),
        sa.UniqueConstraint("factory", name=op.f("uq_registered_models_factory")),
    )


def downgrade() -> None:
    op.drop_table("registered_models")
