"""Hourly rollups per job on each GPU (team rollups group them by the job's team); per-GPU rollups record
where their energy came from; an index for the runs of one recurring job (right-sizing history), which otherwise
scanned every job of the team.

`gpu_job_hourly` starts empty: the rollup task fills the hours it recomputes (the last two, every 5 minutes);
older hours have per-GPU and per-node rollups only. Existing `gpu_hourly` rows keep a null energy source
("unrecorded").

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 09:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import server.models.base

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_job_hourly",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("gpu_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("hour", server.models.base.UtcDateTime(timezone=True), nullable=False),
        sa.Column("job_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("samples", sa.Float(), nullable=False),
        sa.Column("covered_s", sa.Float(), nullable=False),
        sa.Column("busy_s", sa.Float(), nullable=True),
        sa.Column("util_busy_s", sa.Float(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("energy_source", sa.String(length=32), nullable=True),
        sa.Column("memory_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("util_mean_pct", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_gpu_job_hourly_gpu_id_gpus"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_pk"], ["jobs.id"], name=op.f("fk_gpu_job_hourly_job_pk_jobs"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_job_hourly")),
    )
    op.create_index("ix_gpu_job_hourly_hour", "gpu_job_hourly", ["hour"], unique=False)
    op.create_index(op.f("ix_gpu_job_hourly_gpu_id"), "gpu_job_hourly", ["gpu_id"], unique=False)
    op.create_index(op.f("ix_gpu_job_hourly_job_pk"), "gpu_job_hourly", ["job_pk"], unique=False)
    with op.batch_alter_table("gpu_hourly") as batch:
        batch.add_column(sa.Column("energy_source", sa.String(length=32), nullable=True))
    op.create_index("ix_jobs_name_team_started", "jobs", ["name", "team", "started_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_name_team_started", table_name="jobs")
    with op.batch_alter_table("gpu_hourly") as batch:
        batch.drop_column("energy_source")
    op.drop_index(op.f("ix_gpu_job_hourly_job_pk"), table_name="gpu_job_hourly")
    op.drop_index(op.f("ix_gpu_job_hourly_gpu_id"), table_name="gpu_job_hourly")
    op.drop_index("ix_gpu_job_hourly_hour", table_name="gpu_job_hourly")
    op.drop_table("gpu_job_hourly")
