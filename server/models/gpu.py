from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime


class Gpu(Base):
    """One GPU or MIG device of one node. UUIDs are unique per node only: captures and VMs mask them."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "uuid"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    uuid: Mapped[str] = mapped_column(String(200))
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    pci_bus_id: Mapped[str | None] = mapped_column(String(64))
    mig_parent_uuid: Mapped[str | None] = mapped_column(String(200))
    power_source: Mapped[str | None] = mapped_column(String(100))
    power_limit_w: Mapped[float | None] = mapped_column(Float)
    max_sm_clock_mhz: Mapped[float | None] = mapped_column(Float)  # nvmlDeviceGetMaxClockInfo(SM), migration 0016
    slowdown_temperature_c: Mapped[float | None] = mapped_column(Float)  # NVML temperature threshold SLOWDOWN
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    last_seen_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
