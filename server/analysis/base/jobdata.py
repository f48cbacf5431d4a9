"""The inputs of the characterization engine: one job's telemetry, hook steps and layer stats as arrays.

The server builds these from Postgres; the analyzers only read them. Columns are float64 with NaN for
null so that every analyzer is plain vectorised numpy; the report turns NaN back into `None`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class GpuSeries:
    uuid: str
    name: str | None
    memory_total_bytes: int | None
    ts: np.ndarray  # float64 epoch seconds, sorted
    # float64, aligned with ts, NaN = null; keys from SAMPLE_FIELDS, among them the GPM (gpm_*) and health counter
    # columns of issue #20 (all-NaN where the GPU does not report them: `column` fills those never sent)
    columns: dict[str, np.ndarray]
    power_source: str | None = None  # which NVML field fed power_w
    max_sm_clock_mhz: float | None = None  # nvmlDeviceGetMaxClockInfo(SM); None: unknown
    slowdown_temperature_c: float | None = None  # NVML temperature threshold SLOWDOWN; None: unknown
    # the batches' source of the GPU's node: "nvml" (live), "test" (the NVML test double), "replay"; None: unknown
    sample_source: str | None = None

    def column(self, name: str) -> np.ndarray:
        """The named column, or all-NaN when the agent never sent it (an unsupported field)."""
        col = self.columns.get(name)
        if col is None:
            return np.full(self.ts.shape, np.nan)
        return np.asarray(col, dtype=np.float64)

    def has(self, name: str) -> bool:
        """Whether the column holds at least one known value."""
        col = self.columns.get(name)
        return col is not None and bool(np.any(~np.isnan(np.asarray(col, dtype=np.float64))))


@dataclass
class StepSeries:
    """Framework-hook steps, one row per (rank, step); arrays aligned, NaN = unknown."""

    rank: np.ndarray
    step: np.ndarray
    ts: np.ndarray
    wall_s: np.ndarray
    device_s: np.ndarray
    samples: np.ndarray
    allocated_peak_bytes: np.ndarray
    reserved_peak_bytes: np.ndarray
    memory_source: str | None = None

    def __len__(self) -> int:
        return int(np.asarray(self.step).shape[0])


@dataclass
class LayerStat:
    module: str
    module_type: str | None
    forward_s: float | None
    backward_s: float | None
    activation_bytes: int | None
    calls: int


@dataclass(frozen=True)
class ProcessPeak:
    """One process on one of the job's GPUs over the job's window, from NVML's per-process used memory (the
    agent lists each GPU's compute processes at every full reading): an aggregate, not a series."""

    gpu_uuid: str
    pid: int
    job_id: str | None  # the job the agent attributed the process to; None: unattributed
    attribution: str | None  # how: env, slurm, k8s, ...
    peak_used_bytes: int | None  # None: the driver did not say (e.g. no permission for other users' processes)
    first_ts: float
    last_ts: float


@dataclass
class EnergySettings:
    grid_intensity_g_per_kwh: float = 400.0
    pue: float = 1.2
    price_per_kwh_usd: float = 0.12


@dataclass
class JobData:
    job_id: str
    state: str
    name: str | None
    team: str | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    batch_size: int | None
    gpu_type_requested: str | None
    gpus_requested: int | None
    gpus: list[GpuSeries]
    steps: StepSeries | None
    layers: list[LayerStat]
    oom_events: int = 0
    layer_step_s: float | None = None  # mean wall time of the steps the layers were sampled in (their shares' basis)
    trace_summaries: list[dict[str, Any]] = field(default_factory=list)  # Kineto imports, passed through
    processes: list[ProcessPeak] = field(default_factory=list)  # every process seen on the job's GPUs
    energy_settings: EnergySettings = field(default_factory=EnergySettings)
    # The hooks' framework_info (model, optimizer, precision, device memory) and where batch_size came from.
    framework: dict[str, Any] | None = None
    # An estimate stored with the job (metadata.estimate: fleetprof estimate --local --job-id), for MFU.
    estimate: dict[str, Any] | None = None


def empty_steps() -> StepSeries:
    e = np.empty(0, dtype=np.float64)
    return StepSeries(rank=e, step=e, ts=e, wall_s=e, device_s=e, samples=e,
                      allocated_peak_bytes=e, reserved_peak_bytes=e, memory_source=None)


# ---------------------------------------------------------------- JSON helpers


def opt_float(x: Any) -> float | None:
    """A plain float, or None for NaN/inf/None (the report never carries NaN)."""
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def opt_int(x: Any) -> int | None:
    v = opt_float(x)
    return None if v is None else int(round(v))


def nanmax_or_none(a: np.ndarray) -> float | None:
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0 or np.all(np.isnan(a)):
        return None
    return float(np.nanmax(a))


def jsonable(obj: Any) -> Any:
    """Deep-convert numpy scalars/arrays and non-finite floats into JSON-safe Python values."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return opt_float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return [jsonable(x) for x in obj.tolist()]
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(x) for x in obj]
    return obj
