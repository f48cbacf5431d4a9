from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime, utcnow


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    hostname: Mapped[str | None] = mapped_column(String(255))
    driver_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    nvml_version: Mapped[str | None] = mapped_column(String(64))
    last_agent_id: Mapped[str | None] = mapped_column(String(200))
    last_source: Mapped[str | None] = mapped_column(String(32))
    # Reported by the agent's spool: samples dropped because the disk bound was reached.
    dropped_samples_total: Mapped[int] = mapped_column(BigInteger, default=0)
    clock_skew_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_seen_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
