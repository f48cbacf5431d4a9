from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, JsonDoc, UtcDateTime


class Report(Base):
    """The cached characterization of a job, one per analyzer version."""

    __tablename__ = "reports"
    # ix_reports_computed_at: the newest stored report in one probe (it versions what projections derive from them).
    __table_args__ = (Index("ix_reports_computed_at", "computed_at"),)

    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    analyzer_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    computed_at: Mapped[datetime] = mapped_column(UtcDateTime)
    data: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    # What the fleet summary needs of this job (server.analysis.fleet.rollup.job_fleet_row of `data`): a few hundred
    # bytes, so that the summary never reads (and Postgres never decompresses) the whole document.
    fleet_row: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
