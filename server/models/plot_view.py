from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, LargeBinary
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, UtcDateTime


class PlotView(Base):
    """A finished job's plot series at the fine bucket grid (server.jobs.plot_views): its unzoomed plots are
    merged from these instead of scanning every sample again. Written with the job's final report."""

    __tablename__ = "plot_views"

    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    computed_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # numpy .npz (zlib-compressed arrays, no pickles): ~1 MB for 8 GPUs x 24 h
    data: Mapped[bytes] = mapped_column(LargeBinary)
