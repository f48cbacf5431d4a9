"""Live captures of a running job (issue #19): a Kineto trace or an allocator history of K steps, requested over
REST (or by the server on a step-time regression) and carried out by the job's hooks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, JsonDoc, UtcDateTime, utcnow

CAPTURE_KINDS = ("kineto", "allocator")
CAPTURE_STATES = ("requested", "delivered", "capturing", "uploaded", "analyzed", "failed")
FINAL_CAPTURE_STATES = ("analyzed", "failed")


class Capture(Base):
    """One capture and its state machine; each state's time is kept (`<state>_at`). `trace_ids` are the uploads
    (`traces.id`) that carried it, one per rank."""

    __tablename__ = "captures"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    capture_id: Mapped[str] = mapped_column(String(40), unique=True)  # public id, server-chosen
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    steps: Mapped[int] = mapped_column(Integer)
    ranks: Mapped[list[int] | None] = mapped_column(JsonDoc)  # null: every rank
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(2000))
    trigger: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    # trigger["kind"] as a column: the automatic check asks for the job's latest non-manual capture
    trigger_kind: Mapped[str] = mapped_column(String(32))
    requested_by: Mapped[str | None] = mapped_column(String(200))
    requested_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    capturing_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    uploaded_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    analyzed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    failed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    trace_ids: Mapped[list[int]] = mapped_column(JsonDoc, default=list)
    # the ranks that took the request (a capture of several ranks stays pending for the others; see list_captures)
    delivered_ranks: Mapped[list[int]] = mapped_column(JsonDoc, default=list)
