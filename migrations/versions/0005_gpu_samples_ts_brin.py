"""A BRIN index on gpu_samples.ts: reads of the recent past over all GPUs (the fleet summary's current
utilization, the rollup sweep) no longer scan a whole day.

The primary key (gpu_id, ts) serves reads of one GPU; a read of the last minutes of every GPU has no gpu_id to
enter it by and scanned the day's whole partition (seq scan or full index scan): ~864 M rows a day at 10,000
GPUs x 1 Hz. Samples arrive in time order, so a BRIN index (min/max ts per 128 heap pages) narrows such a read
to the pages written in the window, for ~4 MB of index per 100 GB of heap (40 KiB for bench/storage_plans.py's
734 MB day) and next to no insert cost, where a btree on ts would add ~30 B per row. `autosummarize` summarizes
each range as it fills (autovacuum); the unsummarized tail is always read, which is the recent past these queries
want anyway. Created on the partitioned table, so every daily partition, existing or created later, gets its own.

SQLite (embedded mode) gets a plain index on ts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 07:00:00
"""
from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_gpu_samples_ts", "gpu_samples", ["ts"], unique=False, postgresql_using="brin",
                    postgresql_with={"autosummarize": "on"})


def downgrade() -> None:
    op.drop_index("ix_gpu_samples_ts", table_name="gpu_samples")
