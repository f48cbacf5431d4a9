from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime, utcnow


class RegisteredModel(Base):
    """A model factory (`package.module:function`) an operator allowed estimates to import
    (`fleetprof models add`); requests may name only these and the built-in zoo (server.estimate.allowlist)."""

    __tablename__ = "registered_models"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    factory: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
