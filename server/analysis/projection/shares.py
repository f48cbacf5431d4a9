"""What a measured step is made of: the shares of compute-bound, memory-bound, communication and idle time.

From a Kineto trace (`from_kineto`): the HTA-compatible breakdown of `server.analysis.traces.kineto` — compute
kernels split by name into GEMM/convolution/attention (compute-bound at the FLOP/s roof) and the rest (elementwise,
reductions, embeddings: bound by memory bandwidth); memcpy, memset and other GPU activity count as memory-bound;
NCCL kernels as communication; the GPU's idle time (host, input pipeline) as idle.

From NVML telemetry alone (`from_telemetry`): the busy fraction says how much of the step the GPU works; how that
work divides between the two roofs is unknown, so the split carries the whole range (all memory-bound to all
compute-bound) and the central value is `DEFAULT_COMPUTE_BOUND_SHARE` of the busy time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Telemetry alone: the share of busy time taken as compute-bound (central). 0.5 is the middle of what telemetry
# allows; bench/projection.py shows the choice on its calibration models (resnet50, shufflenetv2) only.
DEFAULT_COMPUTE_BOUND_SHARE = 0.5
# Kernel names tell a GEMM from an elementwise kernel, not whether the GEMM reached its roof: small or skinny
# GEMMs run at the bandwidth roof. The low end of the compute-bound share takes half of them as memory-bound; the
# high end takes a quarter of the rest as compute-bound (fused elementwise epilogues, compute-heavy reductions).
MATMUL_SHARE_LOW = 0.5
MEMORY_SHARE_HIGH = 0.25


@dataclass(frozen=True)
class StepShares:
    """Fractions of the measured step (they add up to 1) and the range the compute-bound share may take (the
    difference moves to or from the memory-bound share)."""

    compute_bound: float
    memory_bound: float
    communication: float
    idle: float
    compute_bound_low: float
    compute_bound_high: float
    basis: str  # "kineto" | "telemetry"

    @property
    def busy(self) -> float:
        return self.compute_bound + self.memory_bound + self.communication


def from_telemetry(busy_fraction: float | None) -> StepShares:
    """`busy_fraction`: the share of the step the GPU runs kernels (NVML utilization); None: taken as 1."""
    busy = 1.0 if busy_fraction is None else min(1.0, max(0.0, busy_fraction))
    cb = busy * DEFAULT_COMPUTE_BOUND_SHARE
    return StepShares(compute_bound=cb, memory_bound=busy - cb, communication=0.0, idle=1.0 - busy,
                      compute_bound_low=0.0, compute_bound_high=busy, basis="telemetry")


def from_kineto(row: Mapping[str, Any]) -> StepShares | None:
    """One rank's row of `combine_ranks` (span, compute, communication, memcpy, memset, idle in us and the
    compute kernels' matmul fraction); None when the row has no GPU time."""
    span = row.get("span_us")
    if not span or span <= 0:
        return None

    def us(key: str) -> float:
        return float(row.get(key) or 0.0)

    compute, comm, idle = us("compute_us"), us("communication_us"), us("idle_us")
    other = max(0.0, span - compute - comm - idle)  # memcpy, memset, other GPU activity
    matmul = row.get("compute_matmul_fraction")
    if matmul is None:  # a summary stored before the field existed: the split is unknown
        cb, low, high = 0.5 * compute, 0.0, compute
    else:
        cb = compute * float(matmul)
        low, high = cb * MATMUL_SHARE_LOW, cb + (compute - cb) * MEMORY_SHARE_HIGH
    total = float(span)
    return StepShares(compute_bound=cb / total, memory_bound=(compute - cb + other) / total,
                      communication=comm / total, idle=idle / total, compute_bound_low=low / total,
                      compute_bound_high=high / total, basis="kineto")
