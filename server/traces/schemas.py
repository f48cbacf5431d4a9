"""Response body of the trace upload (POST /api/v1/jobs/{job_id}/traces)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class TraceRead(BaseModel):
    job_id: str
    kind: str
    filename: str | None
    rank: int | None
    size_bytes: int
    sha256: str
    created: bool
    summary: dict[str, Any]
    capture_id: str | None = None  # the live capture this trace carried
