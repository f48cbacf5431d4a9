from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime
from server.models.rollup import GoodputSeconds


class GpuJobHourly(GoodputSeconds, Base):
    """A job's share of a GPU's hour (server.analysis.fleet.rollup.attributed_rollup over the job↔GPU windows of
    `job_gpus`); `job_pk` null = the GPU's time outside every job. The rows of one GPU and hour add up to its
    `gpu_hourly` row. Team rollups group these by the job's current team."""

    __tablename__ = "gpu_job_hourly"
    __table_args__ = (Index("ix_gpu_job_hourly_hour", "hour"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), index=True)
    hour: Mapped[datetime] = mapped_column(UtcDateTime)
    # A deleted job's time becomes unattributed rather than vanishing from the GPU's hour.
    job_pk: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    # Samples attributed: a sample shared by n jobs counts 1/n to each.
    samples: Mapped[float] = mapped_column(Float)
    covered_s: Mapped[float] = mapped_column(Float)
    busy_s: Mapped[float | None] = mapped_column(Float)
    util_busy_s: Mapped[float | None] = mapped_column(Float)
    energy_j: Mapped[float | None] = mapped_column(Float)
    energy_source: Mapped[str | None] = mapped_column(String(32))
    memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    util_mean_pct: Mapped[float | None] = mapped_column(Float)
