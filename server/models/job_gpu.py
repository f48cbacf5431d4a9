from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime


class JobGpu(Base):
    """Which GPU served which job, and when: from registration (`gpu_uuids`) or per-process attribution.

    A null bound means "the job's own start/end".
    """

    __tablename__ = "job_gpus"
    __table_args__ = (UniqueConstraint("job_pk", "gpu_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), index=True)
    first_seen_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_seen_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    source: Mapped[str] = mapped_column(String(32))  # "registered" | "process"
