"""Framework signals from the training job's own hooks: steps, per-layer statistics, lifecycle events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, JsonDoc, UtcDateTime


class JobStep(Base):
    __tablename__ = "job_steps"

    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[datetime] = mapped_column(UtcDateTime)
    wall_s: Mapped[float] = mapped_column(Float)
    device_s: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int | None] = mapped_column(Integer)
    allocated_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    reserved_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_source: Mapped[str | None] = mapped_column(String(32))


class LayerStat(Base):
    __tablename__ = "layer_stats"
    __table_args__ = (UniqueConstraint("job_pk", "rank", "step", "module"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    module: Mapped[str] = mapped_column(String(500))
    module_type: Mapped[str | None] = mapped_column(String(200))
    forward_s: Mapped[float | None] = mapped_column(Float)
    backward_s: Mapped[float | None] = mapped_column(Float)
    activation_bytes: Mapped[int | None] = mapped_column(BigInteger)
    calls: Mapped[int] = mapped_column(Integer, default=1)


class JobEvent(Base):
    """Lifecycle events (job_start, job_end, oom) with their payload."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    ts: Mapped[datetime] = mapped_column(UtcDateTime)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    data: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
