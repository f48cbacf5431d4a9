from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, UtcDateTime


class IngestBatch(Base):
    """Idempotency ledger: (kind, source, seq) of every committed batch. Written in the batch's transaction."""

    __tablename__ = "ingest_batches"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # "samples" | "events"
    source_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    rows: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime)
