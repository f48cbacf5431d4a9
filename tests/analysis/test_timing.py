from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from server.analysis.base.jobdata import GpuSeries, StepSeries
from server.analysis.time.timing import busy_fraction, step_stats, warmup_count

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
    assert st.steps == df.time.nunique()
    assert st.warmup_steps_excluded == k
    rest = per_step[k:]
    assert st.step_time_s.mean == pytest.approx(rest.mean())
    assert st.step_time_s.p50 == pytest.approx(np.percentile(rest, 50))
    assert st.step_time_s.p95 == pytest.approx(np.percentile(rest, 95))
    assert st.samples is None  # the hooks did not say: unknown, not 0


def test_warmup_excludes_leading_slow_steps_only():
    w = np.r_[[5.0, 3.0, 2.0], np.ones(97), [9.0]]
    assert warmup_count(w) == 3
    assert warmup_count(np.ones(50)) == 0


def test_busy_fraction_is_mean_util(real_data):
    g = capture_series(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    u = g.columns["gpu_util_pct"]
    b = busy_fraction([g])
    assert b.gpu_busy_fraction == pytest.approx(np.mean(u) / 100)
    assert b.gpu_active_sample_fraction == pytest.approx(np.mean(u > 0))
    empty = GpuSeries("x", None, None, np.arange(3.0), {})
    assert busy_fraction([empty]).gpu_busy_fraction is None


def test_layer_shares_are_of_the_step_inclusive_and_self():
    """A nested module tree whose root spans the step: ~100 % of the step, not its share of a sum over nesting
    levels (which showed 24.5 % for such a root); self time leaves the children out."""
    from server.analysis.base.jobdata import LayerStat
    from server.analysis.time.timing import layer_table

    def stat(module: str, module_type: str, fwd: float, bwd: float) -> LayerStat:
        return LayerStat(module=module, module_type=module_type, forward_s=fwd, backward_s=bwd, activation_bytes=None,
                         calls=1)

    layers = [stat("ResNet", "ResNet", 0.30, 0.66),           # the model itself, named after its type
              stat("layer1", "Sequential", 0.15, 0.35),
              stat("layer1.0", "BasicBlock", 0.14, 0.31),
              stat("layer1.0.conv1", "Conv2d", 0.06, 0.14),
              stat("fc", "Linear", 0.10, 0.20),
              stat("CrossEntropyLoss", "CrossEntropyLoss", 0.004, 0.006)]  # called outside the model
    rows = {r.module: r for r in layer_table(layers, step_s=1.0)}
    assert rows["ResNet"].time_fraction == pytest.approx(0.96)
    assert rows["layer1.0.conv1"].time_fraction == pytest.approx(0.20)
    assert rows["ResNet"].self_time_s == pytest.approx(0.96 - 0.50 - 0.30)
    assert rows["layer1"].self_time_fraction == pytest.approx(0.50 - 0.45)
    assert rows["layer1.0"].parent == "layer1" and rows["fc"].parent == "ResNet"
    assert rows["ResNet"].parent is None and rows["CrossEntropyLoss"].parent is None
    assert sum(r.self_time_fraction for r in rows.values()) == pytest.approx(0.97)  # each second counted once
    unknown = layer_table(layers, step_s=None)
    assert all(r.time_fraction is None and r.self_time_s is not None for r in unknown)
