from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, JsonDoc, UtcDateTime, utcnow


class Trace(Base):
    """An uploaded artefact: a Kineto trace or a CUDA memory snapshot converted to JSON on the client.

    The bytes live under the blob directory (`blob_key` is a server-chosen name, never a client path);
    `summary` is what the parser extracted.
    """

    __tablename__ = "traces"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # "kineto" | "snapshot"
    filename: Mapped[str | None] = mapped_column(String(500))
    rank: Mapped[int | None] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(200))
    summary: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    uploaded_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
