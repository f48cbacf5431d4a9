from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime


class ProcessSample(Base):
    """GPU memory of one process at one instant, with the job the agent attributed it to (null = unattributed)."""

    __tablename__ = "process_samples"
    __table_args__ = (Index("ix_process_samples_job_ts", "job_id", "ts"),
                      {"postgresql_partition_by": "RANGE (ts)"})

    gpu_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)  # gpus.id, no FK: migration 0005
    ts: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    pid: Mapped[int] = mapped_column(Integer, primary_key=True)
    used_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    job_id: Mapped[str | None] = mapped_column(String(200))
    attribution: Mapped[str | None] = mapped_column(String(64))
