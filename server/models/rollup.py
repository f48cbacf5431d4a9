from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Integer
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, UtcDateTime


class GpuHourly(Base):
    """Hourly rollup per GPU, kept after raw samples expire. Built by a periodic task."""

    __tablename__ = "gpu_hourly"

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    samples: Mapped[int] = mapped_column(Integer)
    busy_samples: Mapped[int] = mapped_column(Integer)
    gpu_util_mean_pct: Mapped[float | None] = mapped_column(Float)
    memory_used_max_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_used_mean_bytes: Mapped[float | None] = mapped_column(Float)
    power_mean_w: Mapped[float | None] = mapped_column(Float)
    energy_j: Mapped[float | None] = mapped_column(Float)
