from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from server.analysis.base.jobdata import GpuSeries, JobData
from server.analysis.characterize import characterize
from server.analysis.fleet.rollup import (
    ENERGY_SOURCES,
    ROLLUP_FIELDS,
    attributed_rollup,
    attribution_weights,
    fleet_summary,
    group_figures,
    hourly_rollup,
    job_fleet_row,
    reduce_hours,
    rollup_gpus,
    sample_durations,
    sample_terms,
)

from .realdata import capture_series

SEQ = "cluster/helios/analysis/2_cluster characterization/Earth_vcs/vc3sl/cluster_sequence_vc.csv"
DAYS = 7


@pytest.fixture(scope="module")
def helios(real_data):
    """A week of Helios' 64-GPU virtual cluster vc3sl, per minute: GPU g is busy at minute t when
    g < running_gpu_num[t] (the trace gives counts, not which GPU: any assignment gives the same totals)."""
    seq = pd.read_csv(real_data / SEQ, nrows=DAYS * 1440)
    ts = pd.to_datetime(seq["time"]).to_numpy().astype("datetime64[s]").astype("int64").astype(float)
    running = seq["running_gpu_num"].to_numpy()
    n_gpus = int(seq["total_gpu_num"].max())
    gpus = [GpuSeries(f"GPU-{g}", None, None, ts, {"gpu_util_pct": np.where(g < running, 100.0, 0.0)})
            for g in range(n_gpus)]
    return seq, ts, gpus


def test_hourly_rollups_against_pandas(helios):
    seq, ts, gpus = helios
    r = rollup_gpus(gpus)
    seq = seq.assign(hour=pd.to_datetime(seq["time"]).dt.floor("h"))
    ref = seq.groupby("hour").agg(running=("running_gpu_num", "sum"), total=("total_gpu_num", "sum"))
    ours = pd.DataFrame({"hour": pd.to_datetime(r["hour_start"], unit="s"), "busy_s": r["busy_s"],
                         "covered_s": r["covered_s"]}).groupby("hour").sum()
    # Each per-minute row stands for 60 s of every GPU it counts.
    np.testing.assert_allclose(ours["busy_s"].to_numpy(), ref["running"].to_numpy() * 60.0)
    np.testing.assert_allclose(ours["covered_s"].to_numpy(), ref["total"].to_numpy() * 60.0)
    assert len(ours) == DAYS * 24
    assert np.all(np.isnan(r["energy_j"]))  # no power in this trace: unknown, not 0


def test_fleet_summary_against_pandas(helios):
    seq, ts, gpus = helios
    r = rollup_gpus(gpus)
    now = float(ts[-1]) + 60.0
    current = {g.uuid: float(g.columns["gpu_util_pct"][-1]) for g in gpus}
    s = fleet_summary(r, now=now, window_s=DAYS * 86400.0, current_util_pct=current)
    assert s["gpus"] == 64
    assert s["gpu_hours"] == pytest.approx(seq["total_gpu_num"].sum() / 60)
    assert s["busy_gpu_hours"] == pytest.approx(seq["running_gpu_num"].sum() / 60)
    assert s["busy_fraction"] == pytest.approx(seq["running_gpu_num"].sum() / seq["total_gpu_num"].sum())
    assert s["idle_gpus_now"] == int(seq["idle_gpu_num"].iloc[-1])
    assert s["energy_j"] is None
    # The last day only.
    day = fleet_summary(r, now=now, window_s=86400.0)
    last = pd.to_datetime(seq["time"]) >= pd.to_datetime(now - 86400, unit="s")
    assert day["busy_gpu_hours"] == pytest.approx(seq.loc[last, "running_gpu_num"].sum() / 60)


def test_energy_rollup_and_gaps(real_data):
    g = capture_series(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    r = hourly_rollup(g.ts, gpu_util_pct=g.columns["gpu_util_pct"], power_w=g.columns["power_w"],
                      memory_used_bytes=g.columns["memory_used_bytes"])
    p = g.columns["power_w"]
    # Power integrated over every interval except the gap: power before and after a gap says nothing about
    # the gap (the time accounting below counts it as one interval, energy leaves it unknown).
    dt = np.diff(g.ts)
    inside = dt <= 5 * np.median(dt)
    assert not inside.all()
    assert np.nansum(r["energy_j"]) == pytest.approx(float(np.sum((0.5 * (p[1:] + p[:-1]) * dt)[inside])))
    assert np.nanmax(r["memory_peak_bytes"]) == g.columns["memory_used_bytes"].max()
    # The ~10 s between the idle and load captures is a gap (> 5× the 1-s interval): one interval counts.
    d = sample_durations(g.ts)
    assert d.sum() == pytest.approx(len(g.ts) * 1.0)


def test_stranded_memory_and_wasteful_jobs(real_data):
    reports = []
    for i, cap in enumerate(["linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
                             "linux-x86_64__nvidia-l40s__595.80.txt"]):
        g = capture_series(real_data / "nvidia-smi" / cap)
        job = JobData(job_id=f"j{i}", state="finished", name=None, team="t", started_at=None, ended_at=None,
                      exit_code=0, batch_size=None, gpu_type_requested=None, gpus_requested=1, gpus=[g],
                      steps=None, layers=[])
        reports.append(characterize(job, now=2e9))
    rows = [job_fleet_row(r) for r in reports]
    expected = sum(r["gpus"][0]["memory_total_bytes"] - r["gpus"][0]["peak_used_bytes"] for r in reports)
    s = fleet_summary({"hour_start": [], "covered_s": [], "busy_s": [], "util_busy_s": [], "energy_j": [],
                       "gpu_uuid": []}, now=2e9, jobs=rows)
    assert s["memory_stranded_bytes"] == expected
    wasted = sorted(rows, key=lambda j: -j["wasted_gpu_hours"])
    assert [j["job_id"] for j in s["most_wasteful_jobs"]] == [j["job_id"] for j in wasted]
    assert s["gpu_hours"] == 0.0 and s["busy_gpu_hours"] is None


def test_attribution_shares_add_up_and_split_shared_samples():
    ts = np.arange(10.0)
    keys, w = attribution_weights(ts, [("a", 2.0, 5.0), ("b", 4.0, 7.5), ("a", 9.0, 9.0)])
    assert keys == ["a", "b", None]
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w[0], [0, 0, 1, 1, 0.5, 0.5, 0, 0, 0, 1])  # both ends count; 4-5 shared
    np.testing.assert_allclose(w[1], [0, 0, 0, 0, 0.5, 0.5, 1, 1, 0, 0])
    np.testing.assert_allclose(w[2], [1, 1, 0, 0, 0, 0, 0, 0, 1, 0])
    keys, w = attribution_weights(ts, [])
    assert keys == [None] and np.all(w == 1.0)


def test_attributed_rollup_splits_a_real_capture_without_losing_anything(real_data):
    g = capture_series(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    terms = sample_terms(g.ts, gpu_util_pct=g.columns["gpu_util_pct"], power_w=g.columns["power_w"],
                         memory_used_bytes=g.columns["memory_used_bytes"])
    whole = reduce_hours(terms)
    assert set(whole["energy_source"]) == {"integrated_power"}
    mid = float(g.ts[len(g.ts) // 2])
    keys, w = attribution_weights(g.ts, [(1, float(g.ts[0]) + 5, mid), (2, mid - 10, float(g.ts[-1]))])
    parts = attributed_rollup(terms, keys, w)
    assert set(parts["key"]) == {1, 2, None}
    for field in ("samples", "covered_s", "busy_s", "util_busy_s", "energy_j"):
        assert np.nansum(parts[field]) == pytest.approx(np.nansum(whole[field])), field
    assert np.nanmax(parts["memory_peak_bytes"]) == np.nanmax(whole["memory_peak_bytes"])
    # A job's figures are those of its samples alone: job 2 holds the end of the load phase.
    sel = g.ts >= mid - 10
    shared = (g.ts >= mid - 10) & (g.ts <= mid)
    j2 = parts["key"] == 2
    assert parts["samples"][j2].sum() == pytest.approx(sel.sum() - 0.5 * shared.sum())
    u = g.columns["gpu_util_pct"]
    share = np.where(shared, 0.5, 1.0)[sel]
    assert np.nansum(parts["util_mean_pct"][j2] * parts["samples"][j2]) / parts["samples"][j2].sum() == \
        pytest.approx(np.sum(u[sel] * share) / share.sum())


def test_energy_source_per_hour_and_unknown_energy():
    ts = np.arange(0.0, 7200.0, 60.0)
    counter = 1000.0 + 0.5 * ts * 300.0
    counter[ts >= 3600] = np.nan  # second hour: power only
    r = hourly_rollup(ts, power_w=np.full(ts.size, 300.0), energy_counter_j=counter)
    assert list(r["energy_source"]) == ["mixed", "integrated_power"]  # the interval across 3600 s uses power
    r = hourly_rollup(ts, gpu_util_pct=np.full(ts.size, 50.0))
    assert list(r["energy_source"]) == [None, None] and np.all(np.isnan(r["energy_j"]))
    assert set(ROLLUP_FIELDS) < set(r)


def test_group_figures_from_sums():
    f = group_figures(covered_s=7200.0, busy_s=3600.0, util_busy_s=1800.0, energy_j=None,
                      memory_peak_bytes=4.0e10, util_mean_weighted=50.0 * 3600 + 0.0 * 1800, util_covered_s=5400.0,
                      energy_source_s={"unknown": 7200.0})
    assert f["gpu_hours"] == 2.0 and f["busy_gpu_hours"] == 1.0 and f["busy_fraction"] == 0.5
    assert f["util_weighted_gpu_hours"] == 0.5 and f["util_mean_pct"] == pytest.approx(100 / 3)
    assert f["energy_j"] is None and f["memory_used_max_bytes"] == 40_000_000_000
    assert set(f["energy_source_gpu_hours"]) == set(ENERGY_SOURCES) and f["energy_source_gpu_hours"]["unknown"] == 2.0
    f = group_figures(covered_s=0.0, busy_s=None, util_busy_s=None, energy_j=None, memory_peak_bytes=None,
                      util_mean_weighted=None, util_covered_s=None, energy_source_s={})
    assert f["busy_gpu_hours"] is None and f["util_mean_pct"] is None and f["busy_fraction"] is None
