from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, UtcDateTime


class GoodputSeconds:
    """The hour's seconds by what the GPU did (goodput, issue #20), a column set both rollup tables carry."""

    # Goodput (server.analysis.fleet.goodput): the util-known time split four ways; null: before migration 0015.
    idle_s: Mapped[float | None] = mapped_column(Float)
    stalled_s: Mapped[float | None] = mapped_column(Float)
    throttled_s: Mapped[float | None] = mapped_column(Float)
    productive_s: Mapped[float | None] = mapped_column(Float)
    # Seconds under each slowdown clock-event reason (health.reasons); null: no reasons reading (or before 0015).
    thermal_s: Mapped[float | None] = mapped_column(Float)
    power_cap_s: Mapped[float | None] = mapped_column(Float)
    hw_slowdown_s: Mapped[float | None] = mapped_column(Float)
    # Seconds within TEMPERATURE_MARGIN_C of the GPU's slowdown temperature; null: no temperature or threshold known
    # (or before migration 0018).
    near_slowdown_s: Mapped[float | None] = mapped_column(Float)


class GpuHourly(GoodputSeconds, Base):
    """Hourly rollup per GPU (server.analysis.fleet.rollup.hourly_rollup), kept after raw samples expire."""

    __tablename__ = "gpu_hourly"
    __table_args__ = (Index("ix_gpu_hourly_hour", "hour"),)

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    samples: Mapped[int] = mapped_column(Integer)
    # Seconds each sample stands for, summed (sample-and-hold; gaps capped at one typical interval).
    covered_s: Mapped[float] = mapped_column(Float)
    busy_s: Mapped[float | None] = mapped_column(Float)          # time at or above the idle threshold
    util_busy_s: Mapped[float | None] = mapped_column(Float)     # time x utilization: kernel-busy seconds
    energy_j: Mapped[float | None] = mapped_column(Float)
    # "hardware_counter" | "integrated_power" | "mixed"; null: no energy, or a row written before 0004.
    energy_source: Mapped[str | None] = mapped_column(String(32))
    memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    util_mean_pct: Mapped[float | None] = mapped_column(Float)


class RollupBacklog(Base):
    """Hours of a GPU range (server.fleet.service.rollup_ranges) that received samples after the periodic sweep
    had passed them (an agent replaying its spool after an outage): rolled up again, then removed."""

    __tablename__ = "rollup_backlog"

    range_k: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
