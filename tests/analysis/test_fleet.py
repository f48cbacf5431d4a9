from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from server.analysis.characterize import characterize
from server.analysis.fleet import fleet_summary, hourly_rollup, job_fleet_row, rollup_gpus, sample_durations
from server.analysis.jobdata import GpuSeries, JobData

from .realdata import capture_series

SEQ = "cluster/helios/analysis/2_cluster characterization/Earth_vcs/vc3sl/cluster_sequence_vc.csv"
DAYS = 7


@pytest.fixture(scope="module")
def helios(shared_data):
    """A week of Helios' 64-GPU virtual cluster vc3sl, per minute: GPU g is busy at minute t when
    g < running_gpu_num[t] (the trace gives counts, not which GPU: any assignment gives the same totals)."""
    seq = pd.read_csv(shared_data / SEQ, nrows=DAYS * 1440)
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


def test_energy_rollup_and_gaps(shared_data):
    g = capture_series(shared_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
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


def test_stranded_memory_and_wasteful_jobs(shared_data):
    reports = []
    for i, cap in enumerate(["linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
                             "linux-x86_64__nvidia-l40s__595.80.txt"]):
        g = capture_series(shared_data / "nvidia-smi" / cap)
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
