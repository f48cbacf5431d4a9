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


class TraceItem(BaseModel):
    """One stored artefact of a job (GET /api/v1/jobs/{job_id}/traces), with where to download it."""

    trace_id: int
    kind: str  # kineto | snapshot
    filename: str | None
    rank: int | None
    size_bytes: int  # as stored (gzip when uploaded gzip)
    sha256: str  # of the stored bytes: a Kineto download hashes to it
    uploaded_at: float  # epoch s
    download_path: str  # GET it: the trace as uploaded, a snapshot as torch's pickle (memory_viz)
    download_formats: list[str]  # the `format` values this artefact takes


class TraceList(BaseModel):
    traces: list[TraceItem]
