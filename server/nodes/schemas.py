"""Response bodies of the inventory routes (GET /api/v1/nodes, /api/v1/gpus)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from fleetprof.report import GpmMeans, HealthFinding


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
    max_sm_clock_mhz: float | None = Field(None, description="nvmlDeviceGetMaxClockInfo(SM)")
    slowdown_temperature_c: float | None = Field(None, description="NVML temperature threshold SLOWDOWN")


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


class GpuGpmRead(GpmMeans):
    """One GPU's NVML GPM metrics over the recent window: means of the samples that carry them (null: unknown,
    the GPU has no GPM or sent none in the window)."""

    node: str
    uuid: str
    index: int
    window_s: float = Field(description="the window read: the last window_s seconds before the request")
    samples: int = Field(description="samples in the window with GPM values")
    last_ts: float | None = Field(description="epoch s of the latest sample with GPM values")
    source: str | None = Field(description="'NVML GPM', labelled when the data came from the NVML test double or a "
                                           "replayed recording; null without GPM samples")
