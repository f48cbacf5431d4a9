"""Job schemas: JobCreate (register or update), JobRead, JobList."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.protocol import JobId, Timestamp

JobState = Literal["pending", "running", "finished", "failed", "killed", "oom"]


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
    metadata: dict[str, Any] | None = None


class JobRead(BaseModel):
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


class JobAck(BaseModel):
    """What an agent token gets back from a registration: enough to carry on, none of the job's metadata
    (name, command, owner), which agents never need to read."""

    job_id: str
    state: str
    node: str | None
    gpu_uuids: list[str]


class JobList(BaseModel):
    items: list[JobRead]
    total: int
    limit: int
    offset: int
