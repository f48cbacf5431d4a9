"""Job schemas: JobCreate (register or update), steps and right-sizing answers; JobRead, JobList and CompareOut (GET
/jobs/compare), which clients and the analyzers read typed, are in fleetprof.api_models."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetprof.api_models import CandidateGpu
from fleetprof.protocol import JobId, Timestamp
from fleetprof.report import Recommendation

# A job's free-form metadata, as compact JSON, at most: it is returned with the job in every list and read, and a
# 15 MB document was once accepted and sent back inline with each page of jobs.
MAX_METADATA_BYTES = 64 * 1024

JobState = Literal["pending", "running", "finished", "failed", "killed", "oom", "lost"]


class JobCreate(BaseModel):
    """Register a job, or update one already registered (fields left out keep their value)."""

    model_config = ConfigDict(extra="forbid")

    job_id: JobId
    team: str | None = Field(default=None, max_length=100)
    name: str | None = Field(default=None, max_length=500)
    command: str | None = Field(default=None, max_length=20_000)
    framework: str | None = Field(default=None, max_length=100)
    host: str | None = Field(default=None, max_length=255)
    user: str | None = Field(default=None, max_length=100)
    node: str | None = Field(default=None, max_length=200, description="node the job runs on")
    gpu_uuids: list[str] | None = Field(default=None, max_length=1024,
                                        description="GPUs of `node` the job holds (binds their telemetry to it)")
    cuda_visible_devices: str | None = Field(default=None, max_length=2000)
    state: JobState | None = None
    started_at: Timestamp | None = None
    ended_at: Timestamp | None = None
    exit_code: int | None = None
    batch_size: int | None = Field(default=None, ge=1, le=10_000_000)
    gpu_type_requested: str | None = Field(default=None, max_length=100)
    gpus_requested: int | None = Field(default=None, ge=0, le=100_000)
    metadata: dict[str, Any] | None = Field(default=None, description=f"free-form, at most {MAX_METADATA_BYTES} "
                                                                      "bytes as compact JSON")

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            size = len(json.dumps(value, separators=(",", ":")))
            if size > MAX_METADATA_BYTES:
                raise ValueError(f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} bytes")
        return value


class JobAck(BaseModel):
    """What an agent token gets back from a registration: enough to carry on, none of the job's metadata
    (name, command, owner), which agents never need to read."""

    job_id: str
    state: str
    node: str | None
    gpu_uuids: list[str]


class StepHistogram(BaseModel):
    edges_s: list[float]
    counts: list[int]
    count: int = Field(description="steps in the range")
    above: int = Field(description="steps above the last edge (the top 0.5 %)")
    max_s: float
    per: str


class StepsOut(BaseModel):
    """Column-wise steps (one row per rank and step), or with `points` per-bucket minima and maxima rows."""

    job_id: str
    source: str
    memory_source: str | None = Field(description="where the allocator peaks came from (the hooks say)")
    count: int = Field(description="rows in the columns")
    rank: list[int]
    step: list[int | None]
    ts: list[float | None] = Field(description="epoch s")
    wall_s: list[float | None]
    allocated_peak_bytes: list[int | None]
    reserved_peak_bytes: list[int | None]
    wall_s_histogram: StepHistogram | None = Field(None, description="with `points`: every step in the range")
    raw_count: int | None = Field(None, description="with `points`: steps in the range before downsampling")
    downsampled: bool | None = None


class MemoryTarget(BaseModel):
    """VPA-style memory target from the runs' interval peaks."""

    target_bytes: int | None
    lower_bound_bytes: int | None
    upper_bound_bytes: int | None
    observed_peak_bytes: int | None
    confidence_days: float | None
    confidence: str | None
    history_s: float
    upper_bound_capped_at: str | None
    oom_bump: bool | None


class RightsizingOut(BaseModel):
    job_id: str
    name: str | None
    team: str | None
    history_job_ids: list[str] = Field(description="the runs used, oldest first")
    runs: int
    memory: MemoryTarget | None = Field(description="null: no run with a known peak")
    recommendations: list[Recommendation]
    projections: list[CandidateGpu] = Field(default_factory=list, description=(
        "the latest run projected onto each other catalogue GPU type (telemetry basis), cheapest per step first; "
        "GET /api/v1/jobs/{job_id}/projection has the full projection"))
    projection_unavailable: str | None = Field(None, description="why there are no projections (null: there are)")


class SeriesOut(BaseModel):
    gpu_uuid: str
    gpu_index: int | None = None
    memory_total_bytes: int | None = None  # the GPU's capacity (inventory), for a capacity line beside the series
    ts: list[float]
    values: list[float | None]
    raw_points: int
    min: float | None
    max: float | None


class TimeseriesOut(BaseModel):
    job_id: str
    metric: str
    unit: str | None
    source: str
    points: int
    series: list[SeriesOut]


class TimeseriesBatchOut(BaseModel):
    job_id: str
    metrics: dict[str, TimeseriesOut]


PLAN_TIMES = "s from the trace window's start"


class OffsetPlanOut(BaseModel):
    """Every traced allocation's offset in one arena (column-wise, one row per allocation): allocations live at
    the same time (`[alloc_seq, free_seq)` overlap) never share a byte of `[offset_bytes, offset_bytes +
    size_bytes rounded up to alignment_bytes)`."""

    job_id: str
    source: str = Field(description="the upload the plan was built from (kind:filename), as the report's")
    trace_source: str = Field(description="what the allocation trace was read from (kineto, allocator events)")
    device: str | None
    algorithm: str = Field(description="the packing heuristic that gave the smallest arena")
    alignment_bytes: int
    arena_bytes: int = Field(description="the arena's size (traced allocations only)")
    lower_bound_bytes: int = Field(description="most aligned bytes live at once: no plan can use less")
    times_relative_to: str
    count: int = Field(description="rows in the columns")
    allocation: list[int] = Field(description="the allocation's index in the trace (order of appearance)")
    size_bytes: list[int]
    offset_bytes: list[int]
    alloc_seq: list[int] = Field(description="event position of the allocation; -1: before the window")
    free_seq: list[int] = Field(description="event position of the free; past the last event: never freed")
    alloc_s: list[float] = Field(description=PLAN_TIMES)
    free_s: list[float] = Field(description=PLAN_TIMES)
    module: list[str | None] | None = Field(None, description=(
        "the top-level module whose forward made the allocation (a Kineto trace recorded with_stack=True); null "
        "entries: before the window or outside any module call; null: the trace has no module events"))


class SwapPlanOut(BaseModel):
    """Allocations to offload to pinned host memory while idle and prefetch before their next use (column-wise, one
    row per swapped allocation, in offload order); each copy hides between the allocation's two uses."""

    job_id: str
    source: str = Field(description="the upload the plan was built from (kind:filename), as the report's")
    trace_source: str
    device: str | None
    candidate_rule: str = Field(description="which allocations could be swapped (the iteration structure used)")
    step_time_s: float | None = Field(description="median step time the plan used; null: no steps known")
    window_s: float = Field(description="the trace window's length, s")
    pcie_bandwidth_bytes_per_s: float
    pcie_bandwidth_source: str
    old_peak_bytes: int = Field(description="traced allocations' peak without swaps")
    new_peak_bytes: int = Field(description="traced allocations' peak with these swaps")
    times_relative_to: str
    count: int = Field(description="rows in the columns")
    allocation: list[int] = Field(description="the allocation's index in the trace (as in the offset plan)")
    size_bytes: list[int]
    alloc_s: list[float] = Field(description=PLAN_TIMES)
    free_s: list[float] = Field(description=PLAN_TIMES)
    offload_start_s: list[float] = Field(description=PLAN_TIMES + "; device-to-host copy")
    offload_end_s: list[float] = Field(description=PLAN_TIMES)
    prefetch_start_s: list[float] = Field(description=PLAN_TIMES + "; host-to-device copy")
    prefetch_end_s: list[float] = Field(description=PLAN_TIMES)
    module: list[str | None] | None = Field(None, description=(
        "the top-level module whose forward made the allocation (a Kineto trace recorded with_stack=True); null "
        "entries: before the window or outside any module call; null: the trace has no module events"))
    step_boundaries_s: list[float] | None = Field(None, description=PLAN_TIMES + "; the ProfilerStep spans' starts "
                                                  "and the last one's end (null: the trace names no steps)")
    period_s: float | None = Field(None, description="the detected iteration period the plan used, s (null: none)")
    step: list[int | None] | None = Field(None, description="the step (index into step_boundaries_s) the allocation "
                                                           "was made in; null: outside the steps or none known")
    within_step: list[bool | None] | None = Field(None, description="both copies lie inside that step (the transfer "
                                                                    "window checked against the measured step)")
