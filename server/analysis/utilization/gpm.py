"""The report's `utilization.gpm`: NVML GPM means per GPU over the job's samples, and for the job.

GPM (Hopper and later) says how much of the GPU a kernel used, where NVML's utilization only says that one ran:
a job at 100 % utilization can keep 10 % of its SMs busy. Each sample's GPM values cover the interval since the
agent's previous reading, so a plain mean over the samples weighs every interval the same (the agent's intervals
are equal). A GPU without GPM (before Hopper, a MIG device) has no values: its figures are null ("unknown"),
never 0, and it does not count in the job's means, which are the means of the GPUs' means.
"""

from __future__ import annotations

import numpy as np

from fleetprof.report import GpmGpu, GpmSection, gpm_source_label
from server.analysis.base.jobdata import GpuSeries

# GpmGpu / GpmSection field -> sample column
MEANS: tuple[tuple[str, str], ...] = (
    ("sm_activity_mean_pct", "gpm_sm_activity_pct"),
    ("sm_occupancy_mean_pct", "gpm_sm_occupancy_pct"),
    ("tensor_activity_mean_pct", "gpm_tensor_activity_pct"),
    ("dram_bw_util_mean_pct", "gpm_dram_bw_util_pct"),
    ("pcie_tx_mean_bytes_per_s", "gpm_pcie_tx_bytes_per_s"),
    ("pcie_rx_mean_bytes_per_s", "gpm_pcie_rx_bytes_per_s"),
    ("nvlink_tx_mean_bytes_per_s", "gpm_nvlink_tx_bytes_per_s"),
    ("nvlink_rx_mean_bytes_per_s", "gpm_nvlink_rx_bytes_per_s"),
)


def _mean(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.mean(a)) if a.size else None


def gpu_gpm(g: GpuSeries) -> GpmGpu:
    """One GPU's means; `samples` counts the samples with SM activity (the metric every GPM GPU reports)."""
    sm = g.column("gpm_sm_activity_pct")
    samples = int(np.count_nonzero(~np.isnan(sm)))
    means = {name: _mean(g.column(col)) for name, col in MEANS}
    return GpmGpu(gpu_uuid=g.uuid, samples=samples, source=gpm_source_label(g.sample_source) if samples else None,
                  **means)


def gpm_section(gpus: list[GpuSeries]) -> GpmSection:
    per_gpu = [gpu_gpm(g) for g in gpus]
    with_gpm = [p for p in per_gpu if p.samples]
    means: dict[str, float | None] = {}
    for name, _ in MEANS:
        values = [v for p in with_gpm if (v := getattr(p, name)) is not None]
        means[name] = float(np.mean(values)) if values else None
    labels = sorted({p.source for p in with_gpm if p.source is not None})
    return GpmSection(gpus_with_gpm=len(with_gpm), source="; ".join(labels) or None, gpus=per_gpu, **means)
