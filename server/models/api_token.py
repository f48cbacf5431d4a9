from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime, utcnow

SCOPES = ("agent", "team", "scheduler", "operator")


class ApiToken(Base):
    """Tokens are stored as SHA-256 digests only; the plaintext is shown once, by `fleetprof token create`."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str] = mapped_column(String(16))
    team: Mapped[str | None] = mapped_column(String(100))
    node: Mapped[str | None] = mapped_column(String(200))
    description: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
