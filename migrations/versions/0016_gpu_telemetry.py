"""GPM metrics and health counters on every GPU sample; each GPU's maximum SM clock and slowdown temperature
(issue #20). All nullable without defaults: adding them to the partitioned table rewrites nothing.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 21:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

GPM_COLUMNS = ("gpm_sm_activity_pct", "gpm_sm_occupancy_pct", "gpm_tensor_activity_pct", "gpm_dram_bw_util_pct",
               "gpm_pcie_tx_bytes_per_s", "gpm_pcie_rx_bytes_per_s", "gpm_nvlink_tx_bytes_per_s",
               "gpm_nvlink_rx_bytes_per_s")
COUNTER_COLUMNS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "retired_pages_sbe", "retired_pages_dbe",
                   "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable",
                   "remapped_rows_pending", "remapped_rows_failed", "pcie_replay_total", "nvlink_errors_total")
GPU_COLUMNS = ("max_sm_clock_mhz", "slowdown_temperature_c")


def upgrade() -> None:
    for name in GPM_COLUMNS:
        op.add_column("gpu_samples", sa.Column(name, sa.Float(), nullable=True))
    for name in COUNTER_COLUMNS:
        op.add_column("gpu_samples", sa.Column(name, sa.BigInteger(), nullable=True))
    for name in GPU_COLUMNS:
        op.add_column("gpus", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in reversed(GPU_COLUMNS):
        op.drop_column("gpus", name)
    for name in reversed(GPM_COLUMNS + COUNTER_COLUMNS):
        op.drop_column("gpu_samples", name)
