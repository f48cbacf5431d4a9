"""The GPU power rule: the share of TDP a GPU draws from what its step does (one rule, used by the estimator's
roofline and by projections onto other GPUs).

While the GPU computes it draws ~50% of TDP on memory- or launch-bound kernels up to ~85% on GEMM-bound training;
while it waits on the host it draws `WAITING_POWER_FRACTION` (clocks up, SMs mostly idle). The step's draw is the
two weighted by the share of the step the GPU computes.
"""

from __future__ import annotations

# Power drawn with clocks up but the SMs mostly waiting on the host, as a fraction of TDP: an H100 ran a
# host-bound CNN job at 110 W mean (tests/gpu/test_run_on_gpu.py, 2026-11-25), against 75 W idle at low clocks.
WAITING_POWER_FRACTION = 0.16
BUSY_MEMORY_BOUND_FRACTION = 0.5  # of TDP, memory-/launch-bound kernels
BUSY_COMPUTE_BOUND_FRACTION = 0.85  # of TDP, GEMM-bound training


def power_fraction(compute_bound_fraction: float, busy_fraction: float = 1.0,
                   waiting_fraction: float = WAITING_POWER_FRACTION) -> float:
    """Share of TDP drawn. `compute_bound_fraction`: of the GPU's busy time; `busy_fraction`: of the step."""
    spread = BUSY_COMPUTE_BOUND_FRACTION - BUSY_MEMORY_BOUND_FRACTION
    busy = BUSY_MEMORY_BOUND_FRACTION + spread * compute_bound_fraction
    return waiting_fraction + busy_fraction * (busy - waiting_fraction)


def compute_bound_from_power(power_fraction_of_tdp: float, busy_fraction: float = 1.0,
                             waiting_fraction: float = WAITING_POWER_FRACTION) -> float | None:
    """The inverse of `power_fraction`: the compute-bound share of the busy time a measured draw (a share of TDP)
    implies at this busy fraction, clipped to [0, 1]; None when the GPU is (almost) never busy."""
    if busy_fraction <= 0.05:
        return None
    busy = waiting_fraction + (power_fraction_of_tdp - waiting_fraction) / busy_fraction
    spread = BUSY_COMPUTE_BOUND_FRACTION - BUSY_MEMORY_BOUND_FRACTION
    return min(1.0, max(0.0, (busy - BUSY_MEMORY_BOUND_FRACTION) / spread))
