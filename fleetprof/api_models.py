"""Answers of the REST API that clients read typed, beside the report (`fleetprof.report`): one definition, which the
server answers with and the dashboard validates against.

Like the report, they live in the bare package (pydantic only) so that a client needs no server code to read them.
Fields may be added, never renamed (PRODUCT.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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


class JobWaste(BaseModel):
    """A job's fleet row (server.analysis.fleet.rollup.job_fleet_row), ranked by wasted GPU-hours."""

    model_config = ConfigDict(extra="allow")

    job_id: str | None = None
    team: str | None = None
    state: str | None = None
    gpus: int | None = None
    gpu_hours: float | None = None
    gpu_busy_fraction: float | None = None
    wasted_gpu_hours: float | None = Field(None, description="gpu_hours x (1 - gpu_busy_fraction)")
    memory_stranded_bytes: int | None = None
    idle_energy_j: float | None = Field(None, description="energy the job's GPUs drew while idle")


class FleetSummary(BaseModel):
    """GET /api/v1/fleet/summary: the fleet over a window, from hourly rollups and the stored job fleet rows."""

    model_config = ConfigDict(extra="allow")

    window_s: float
    generated_at: float = Field(description="epoch s")
    gpus: int = Field(description="GPUs with rollups in the window")
    gpus_total: int
    gpu_hours: float
    busy_gpu_hours: float | None
    busy_fraction: float | None
    util_weighted_gpu_hours: float | None
    idle_gpus_now: int | None
    gpus_unknown_now: int | None
    energy_j: float | None
    memory_stranded_bytes: int | None
    most_wasteful_jobs: list[JobWaste]
    sources: dict[str, str]
