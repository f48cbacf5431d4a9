from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from server.analysis.jobdata import GpuSeries, StepSeries
from server.analysis.timing import busy_fraction, step_stats, warmup_count

from .realdata import capture_series


def _steps_from_alibaba(real_data, job: int) -> tuple[StepSeries, pd.DataFrame]:
    df = pd.read_csv(real_data / f"cluster/alibaba-gpu-v2020/mini-batch-time/data/job_{job}_norm.csv", index_col=0)
    n = len(df)
    nan = np.full(n, np.nan)
    s = StepSeries(rank=df.worker.to_numpy(float), step=df.time.to_numpy(float), ts=df.time.to_numpy(float),
                   wall_s=df.batch_time_norm.to_numpy(float) / 1000, device_s=nan, samples=nan,
                   allocated_peak_bytes=nan, reserved_peak_bytes=nan)
    return s, df


@pytest.mark.parametrize("job", [1, 2, 3, 4])
def test_step_distribution_is_slowest_rank_per_step(real_data, job):
    s, df = _steps_from_alibaba(real_data, job)
    per_step = df.groupby("time").batch_time_norm.max().to_numpy(float) / 1000  # independent
    k = warmup_count(per_step)
    st = step_stats(s)
    assert st["steps"] == df.time.nunique()
    assert st["warmup_steps_excluded"] == k
    rest = per_step[k:]
    assert st["step_time_s"]["mean"] == pytest.approx(rest.mean())
    assert st["step_time_s"]["p50"] == pytest.approx(np.percentile(rest, 50))
    assert st["step_time_s"]["p95"] == pytest.approx(np.percentile(rest, 95))
    assert st["samples"] is None  # the hooks did not say: unknown, not 0


def test_warmup_excludes_leading_slow_steps_only():
    w = np.r_[[5.0, 3.0, 2.0], np.ones(97), [9.0]]
    assert warmup_count(w) == 3
    assert warmup_count(np.ones(50)) == 0


def test_busy_fraction_is_mean_util(real_data):
    g = capture_series(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    u = g.columns["gpu_util_pct"]
    b = busy_fraction([g])
    assert b["gpu_busy_fraction"] == pytest.approx(np.mean(u) / 100)
    assert b["gpu_active_sample_fraction"] == pytest.approx(np.mean(u > 0))
    empty = GpuSeries("x", None, None, np.arange(3.0), {})
    assert busy_fraction([empty])["gpu_busy_fraction"] is None
