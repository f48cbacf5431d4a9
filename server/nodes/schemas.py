"""Response bodies of the inventory routes (GET /api/v1/nodes, /api/v1/gpus)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from fleetprof.report import HealthFinding


class GpuRead(BaseModel):
    node: str
    uuid: str
    index: int
    name: str
    memory_total_bytes: int | None
    pci_bus_id: str | None
    mig_parent_uuid: str | None
    power_source: str | None
    power_limit_w: float | None
    healthy: bool
    last_seen_at: float | None
    findings: list[HealthFinding] | None = Field(
        default=None, description="health findings over the last hour (GET /gpus?node=N only; null: not computed)")


class NodeRead(BaseModel):
    name: str
    hostname: str | None
    driver_version: str | None
    cuda_version: str | None
    nvml_version: str | None
    source: str | None
    gpu_count: int
    dropped_samples_total: int
    clock_skew_s: float | None
    last_seen_at: float | None
