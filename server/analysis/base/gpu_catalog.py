"""The GPU model catalogue: memory, TDP, price, peak throughput. Editable JSON, loaded once per path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_CATALOG = Path(__file__).with_name("gpu_catalog.json")


@dataclass(frozen=True)
class GpuModel:
    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    tdp_w: float
    price_per_hour_usd: float | None
    peak_fp32_tflops: float
    peak_fp16_tflops: float | None
    peak_bf16_tflops: float | None
    mem_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    cuda_context_bytes: int
    measured: bool
    # Health checks (server.analysis.health): the SM clock a busy GPU should reach (nvidia-smi -q "Max Clocks",
    # NVML nvmlDeviceGetMaxClockInfo) and the temperature at which the GPU slows itself down (NVML temperature
    # threshold SLOWDOWN). None: not in the catalogue (the agent's own reading is preferred anyway).
    max_sm_clock_mhz: float | None = None
    slowdown_temperature_c: float | None = None

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for 'fp32', 'fp16' or 'bf16' (falls back to fp32 where the format is unsupported)."""
        tflops = {"fp16": self.peak_fp16_tflops, "bf16": self.peak_bf16_tflops}.get(precision)
        return (tflops or self.peak_fp32_tflops) * 1e12


@lru_cache(maxsize=8)
def load_catalog(path: Path = DEFAULT_CATALOG) -> tuple[GpuModel, ...]:
    data = json.loads(Path(path).read_text())
    return tuple(
        GpuModel(**{**m, "aliases": tuple(m.get("aliases", ()))}) for m in data["models"]
    )


def find_model(name: str, catalog: tuple[GpuModel, ...] | None = None) -> GpuModel | None:
    """Match a catalogue name or an NVML/nvidia-smi device name (case-insensitive); None when unknown."""
    wanted = name.strip().lower()
    for model in catalog or load_catalog():
        if wanted == model.name.lower() or wanted in (a.lower() for a in model.aliases):
            return model
    return None
