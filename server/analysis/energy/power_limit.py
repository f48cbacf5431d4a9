"""The power limit and application clocks a job's GPUs ran at, from the samples (each carries the limit the
driver enforced then: agent protocol `power_limit_w`, `app_sm_clock_mhz`, `app_mem_clock_mhz`).

The figure for a GPU is the value in force for most of its samples (the mode), since the limit is a setting,
not a measurement: a mean of 300 W and 400 W would name a cap nobody set. `changed` says when it moved during
the job. Unknown (an agent older than the field, a GPU that does not report it) is None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from server.analysis.base.jobdata import GpuSeries


@dataclass(frozen=True)
class GpuSetting:
    power_limit_w: float | None
    power_limit_changed: bool | None  # None: unknown
    app_sm_clock_mhz: float | None
    app_mem_clock_mhz: float | None


def _mode(values: np.ndarray) -> float | None:
    known = values[~np.isnan(values)]
    if not known.size:
        return None
    uniq, counts = np.unique(known, return_counts=True)
    return float(uniq[np.argmax(counts)])  # ties: the lower value (np.unique sorts)


def gpu_setting(g: GpuSeries) -> GpuSetting:
    limit = g.column("power_limit_w")
    known = limit[~np.isnan(limit)]
    return GpuSetting(power_limit_w=_mode(limit),
                      power_limit_changed=bool(np.unique(known).size > 1) if known.size else None,
                      app_sm_clock_mhz=_mode(g.column("app_sm_clock_mhz")),
                      app_mem_clock_mhz=_mode(g.column("app_mem_clock_mhz")))


def job_power_limit_w(gpus: Sequence[GpuSeries]) -> float | None:
    """The limit the job's GPUs ran at: the mode over all their samples; None when no sample says."""
    cols = [g.column("power_limit_w") for g in gpus]
    return _mode(np.concatenate(cols)) if cols else None
