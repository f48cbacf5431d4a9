"""Answers of the fleet routes (operators): hourly rollups, the dashboard's timeline and headroom (the summary, which
clients read typed, is fleetprof.api_models.FleetSummary).

The routes build plain dicts (analysis code); these models state them in OpenAPI, and FastAPI checks the small
ones on the way out. Rows that follow another document (a job's fleet row, a rollup group) are `extra="allow"`:
a figure added there reaches clients before it is declared here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RollupRow(BaseModel):
    model_config = ConfigDict(extra="allow")

    hour_start: float = Field(description="epoch s")
    key: str | None
    node: str | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    team: str | None = None
    jobs: int | None = Field(None, description="by=team only")
    gpus: int
    gpu_hours: float
    busy_gpu_hours: float | None
    busy_fraction: float | None
    util_weighted_gpu_hours: float | None
    util_mean_pct: float | None
    energy_j: float | None
    energy_source_gpu_hours: dict[str, float]
    memory_used_max_bytes: int | None


class FleetRollups(BaseModel):
    by: Literal["gpu", "node", "team"]
    window_s: float
    generated_at: float = Field(description="epoch s")
    total: int
    limit: int
    offset: int
    rows: list[RollupRow]
    sources: dict[str, str]


class TimelineGpu(BaseModel):
    node: str
    index: int | None
    uuid: str


class FleetTimeline(BaseModel):
    """Per GPU and hour (rows: gpus, columns: hours)."""

    model_config = ConfigDict(extra="allow")

    window_s: float
    generated_at: float = Field(description="epoch s")
    hours: list[float] = Field(description="epoch s of each hour's start")
    gpus: list[TimelineGpu]
    gpu_util_mean_pct: list[list[float | None]]
    truncated: bool
    energy_j: list[float | None] = Field(description="fleet energy per hour")
    energy_gpus: list[int]
    energy_by_source_j: dict[str, list[float | None]]
    energy_source: list[str | None]
    sources: dict[str, str]


class HeadroomJob(BaseModel):
    job_id: str | None
    team: str | None
    peak_used_bytes: int | None
    memory_total_bytes: int | None
    headroom_bytes: int | None
    gpu_count: int | None


class FleetHeadroom(BaseModel):
    window_s: float
    jobs: list[HeadroomJob]
    source: str
