"""What a measured step is made of: the shares of compute-bound, memory-bound, communication and idle time.

From a Kineto trace (`from_kineto`): the HTA-compatible breakdown of `server.analysis.traces.kineto` — compute
kernels split by name into GEMM/convolution/attention (compute-bound at the FLOP/s roof) and the rest (elementwise,
reductions, embeddings: bound by memory bandwidth); memcpy, memset and other GPU activity count as memory-bound;
NCCL kernels as communication; the GPU's idle time (host, input pipeline) as idle.

From NVML telemetry alone (`from_telemetry`): the busy fraction says how much of the step the GPU works; how that
work divides between the two roofs is read from the source run's own draw: the power rule inverted
(`power_model.compute_bound_from_power`: its mean power as a share of TDP at its busy fraction) gives a
compute-bound share, shrunk towards `DEFAULT_COMPUTE_BOUND_SHARE` by `POWER_SIGNAL_WEIGHT`. Both constants were
fitted by bench/projection.py on Zeus' five models and validated leave-one-model-out (each model scored by constants
fitted without it); without a measured power the prior alone is used. The compute-bound share's range still runs
from all memory-bound to all compute-bound (the kineto basis' band uses it; the telemetry band is calibrated,
`project.TELEMETRY_BAND_LOG_HALFWIDTH`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.analysis.energy.power_model import compute_bound_from_power

# Telemetry alone: the share of busy time taken as compute-bound (central) before the power signal, and the weight
# of the power signal against it: the grid's best median step-time error over Zeus' five models (bench/projection.py,
# `product_constants` in bench/results/projection.json; held-out figures from `leave_one_model_out`); frozen here.
DEFAULT_COMPUTE_BOUND_SHARE = 0.25
POWER_SIGNAL_WEIGHT = 0.25
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
    split_source: str = "kineto kernel names"  # where the compute-/memory-bound split came from

    @property
    def busy(self) -> float:
        return self.compute_bound + self.memory_bound + self.communication


def telemetry_compute_share(power_fraction_of_tdp: float | None, busy_fraction: float,
                             *, prior: float | None = None, weight: float | None = None) -> tuple[float, str]:
    """(compute-bound share of the busy time, where it came from). `power_fraction_of_tdp`: the source run's mean
    power / its GPU's TDP; None: the prior alone. `prior`/`weight`: the frozen constants unless given (the bench's
    calibration grid)."""
    prior = DEFAULT_COMPUTE_BOUND_SHARE if prior is None else prior
    weight = POWER_SIGNAL_WEIGHT if weight is None else weight
    signal = (compute_bound_from_power(power_fraction_of_tdp, busy_fraction)
              if power_fraction_of_tdp is not None else None)
    if signal is None:
        return prior, f"prior: {prior:g} of the busy time (no measured power)"
    share = (1.0 - weight) * prior + weight * signal
    return share, (f"{weight:g} x the power rule inverted at the measured draw ({power_fraction_of_tdp:.2f} of TDP: "
                   f"{signal:.2f}) + {1.0 - weight:g} x the prior {prior:g}")


def from_telemetry(busy_fraction: float | None, power_fraction_of_tdp: float | None = None,
                   *, prior: float | None = None, weight: float | None = None) -> StepShares:
    """`busy_fraction`: the share of the step the GPU runs kernels (NVML utilization); None: taken as 1.
    `power_fraction_of_tdp`: the source run's mean draw / its GPU's TDP (None: not measured)."""
    busy = 1.0 if busy_fraction is None else min(1.0, max(0.0, busy_fraction))
    share, source = telemetry_compute_share(power_fraction_of_tdp, busy, prior=prior, weight=weight)
    cb = busy * share
    return StepShares(compute_bound=cb, memory_bound=busy - cb, communication=0.0, idle=1.0 - busy,
                      compute_bound_low=0.0, compute_bound_high=busy, basis="telemetry", split_source=source)


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
