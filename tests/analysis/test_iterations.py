from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from server.analysis.base.jobdata import GpuSeries
from server.analysis.time.iterations import cross_check, detect_period, input_stalls, rank_stragglers, telemetry_period

MINI_BATCH = "cluster/alibaba-gpu-v2020/mini-batch-time/data"
WINDOW_S = 14_000.0  # stay inside the analysed window, so the known period is the mean over all of it


def _load(real_data, job: int) -> pd.DataFrame:
    return pd.read_csv(real_data / MINI_BATCH / f"job_{job}_norm.csv", index_col=0)


def _telemetry(d: np.ndarray, rng: np.random.Generator, *, duty: float = 0.7, stall_every: int = 0):
    """1-Hz power and utilization of a job whose iterations last `d` seconds: compute for the first `duty`
    of each iteration (300 W, 98%), communication/optimizer for the rest (120 W, 35%), plus a thermal drift
    and noise. With stall_every=k, every k-th iteration also waits on its input (util ~0) for 2 s."""
    edges = np.concatenate([[0.0], np.cumsum(d)])
    ts = np.arange(0.0, edges[-1], 1.0)
    i = np.searchsorted(edges, ts, side="right") - 1
    phase = (ts - edges[i]) / d[i]
    high = phase < duty
    power = np.where(high, 300.0, 120.0) + 20.0 * ts / ts[-1] + rng.normal(0, 10, ts.size)
    util = np.clip(np.where(high, 98.0, 35.0) + rng.normal(0, 3, ts.size), 0, 100)
    if stall_every:
        stalled = (i % stall_every == 0) & (ts - edges[i] < 2.0)
        util[stalled] = rng.uniform(0, 3, stalled.sum())
    return ts + 1.7e9, power, util


def _regular_series(real_data):
    """(job, worker, durations) for workers whose iteration time is regular enough to have a period: the
    coefficient of variation ≤ 0.25 (job 4's workers 5 and 6 have rare 4× iterations, CoV ~0.7)."""
    for job in (1, 2, 3, 4):
        df = _load(real_data, job)
        for w, g in df.groupby("worker"):
            d = g.sort_values("time")["batch_time_norm"].to_numpy(float)
            if d.std() / d.mean() <= 0.25:
                yield job, w, d


@pytest.mark.parametrize("mean_period_s", [4.0, 7.3, 15.0])
def test_period_from_telemetry_matches_real_iteration_times(real_data, mean_period_s):
    """The data is normalised (0–1000), so we choose the time unit; the sequence of iteration times, with
    its jitter, drift and outliers, is the real one. Detected period within 5% of the mean iteration time."""

    rng = np.random.default_rng(1)
    errors = []
    for job, w, d in _regular_series(real_data):
        d = d / d.mean() * mean_period_s
        d = d[np.cumsum(d) <= WINDOW_S]
        ts, power, util = _telemetry(d, rng)
        res = detect_period(ts, power, signal="power_w")
        assert res is not None, (job, w)
        # The known period: the mean iteration, rare outliers (> 2× the median: checkpoints, stalls) left
        # out, since a stall is not part of the rhythm the telemetry repeats.
        regular = d[d <= 2 * np.median(d)]
        errors.append(res.period_s / regular.mean() - 1.0)
        assert abs(errors[-1]) <= 0.05, (job, w, res, regular.mean())
    assert len(errors) >= 30


def test_telemetry_period_picks_signal_and_agrees_with_hooks(real_data):
    d = _load(real_data, 2).query("worker == 3").sort_values("time")["batch_time_norm"].to_numpy(float) / 100
    ts, power, util = _telemetry(d, np.random.default_rng(2))
    g = GpuSeries("g", None, None, ts, {"power_w": power, "gpu_util_pct": util,
                                         "memory_used_bytes": np.full(ts.size, 1e9)})  # flat memory: no period
    res = telemetry_period([g])
    assert res is not None and res.signal in ("power_w", "gpu_util_pct")
    assert res.period_s == pytest.approx(d.mean(), rel=0.05)
    check = cross_check(res.period_s, float(np.median(d)))
    assert check.agrees_with_hooks is True and check.steps_per_period == 1
    # A telemetry cycle of 4 steps (gradient accumulation) is a multiple, still in agreement.
    assert cross_check(4 * d.mean(), d.mean()).steps_per_period == 4
    assert cross_check(1.5 * d.mean(), d.mean()).agrees_with_hooks is False


def test_noise_has_no_period():
    rng = np.random.default_rng(3)
    ts = 1.7e9 + np.arange(3000.0)
    assert detect_period(ts, rng.normal(200, 10, ts.size)) is None
    assert detect_period(ts, np.full(ts.size, 5.0)) is None


def test_periodic_input_stalls(real_data):
    d = _load(real_data, 3).query("worker == 4").sort_values("time")["batch_time_norm"].to_numpy(float) / 100
    rng = np.random.default_rng(4)
    ts, _, util = _telemetry(d, rng, stall_every=10)
    s = input_stalls(ts, util)
    assert s.periodic is True
    assert s.stall_period_s == pytest.approx(10 * d.mean(), rel=0.05)
    ts, _, util = _telemetry(d, rng)
    clean = input_stalls(ts, util)
    assert clean.periodic is False and clean.stall_fraction < 0.02


def test_stragglers_on_real_workers(real_data):
    for job in (1, 2, 3, 4):
        df = _load(real_data, job)
        med = df.groupby("worker")["batch_time_norm"].median()
        expected = set(med[med > 1.1 * med.median()].index)
        res = rank_stragglers(df["worker"].to_numpy(), df["batch_time_norm"].to_numpy(float))
        assert {s.rank for s in res.stragglers} == expected
        assert res.ranks == 10
    # Job 4 has several slow workers (the dataset's README says so): about 4× the fast ones.
    res = rank_stragglers(_load(real_data, 4)["worker"].to_numpy(), _load(real_data, 4)["batch_time_norm"].to_numpy(float))
    assert len(res.stragglers) >= 3
    assert all(s.slowdown_fraction > 0.3 for s in res.stragglers)
