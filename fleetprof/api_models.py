"""Answers of the REST API that clients read typed, beside the report (`fleetprof.report`): one definition, which the
server answers with and the dashboard validates against.

Like the report, they live in the bare package (pydantic only) so that a client needs no server code to read them.
Fields may be added, never renamed (PRODUCT.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class JobRead(BaseModel):
    """GET /api/v1/jobs/{job_id}: a job's metadata and state. Times are epoch s."""

    job_id: str
    team: str | None
    name: str | None
    command: str | None
    framework: str | None
    host: str | None
    user: str | None
    node: str | None
    state: str
    batch_size: int | None
    gpu_type_requested: str | None
    gpus_requested: int | None
    exit_code: int | None
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None
    duration_s: float | None
    gpu_uuids: list[str]
    metadata: dict[str, Any]
    end_reason: str | None = Field(default=None, description="why the server ended the job (state `lost`); "
                                   "null when whoever ran it reported its end")


class JobList(BaseModel):
    """GET /api/v1/jobs: one page of jobs, newest first."""

    items: list[JobRead]
    total: int
    limit: int
    offset: int
