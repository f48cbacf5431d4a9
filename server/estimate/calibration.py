"""Per-GPU memory outside the traced tensors: CUDA context (outside the allocator) and the cuBLAS workspace
(inside it). Entries and their sources live in calibration.json; a GPU missing there falls back to the
catalogue's `cuda_context_bytes` and the non-Hopper cuBLAS default."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from server.analysis.base.gpu_catalog import GpuModel

DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.json")
DEFAULT_CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8


@dataclass(frozen=True)
class Calibration:
    context_bytes: int
    cublas_workspace_bytes: int
    source: str
    measured: bool


@lru_cache(maxsize=4)
def _table(path: Path) -> dict[str, dict]:
    return json.loads(path.read_text())["models"]


def calibration_for(gpu: GpuModel, path: Path = DEFAULT_CALIBRATION) -> Calibration:
    entry = _table(path).get(gpu.name)
    if entry is None:
        return Calibration(
            gpu.cuda_context_bytes, DEFAULT_CUBLAS_WORKSPACE_BYTES, "gpu_catalog cuda_context_bytes", gpu.measured
        )
    return Calibration(
        int(entry["context_bytes"]), int(entry["cublas_workspace_bytes"]), entry["source"], bool(entry["measured"])
    )
