from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from server.analysis.base.jobdata import JobData, LayerStat, StepSeries
from server.analysis.characterize import ANALYZER_VERSION, characterize

from .realdata import capture_series

CAPTURES = ["linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", "linux-x86_64__nvidia-h200__590.48.01.txt",
            "linux-x86_64__nvidia-l40s__595.80.txt"]

PRODUCT_KEYS = {
    "": {"job_id", "state", "analyzed_at", "duration_s", "gpus", "memory", "time", "utilization", "energy",
         "recommendations", "sources"},
    "gpus": {"uuid", "name", "memory_total_bytes", "peak_used_bytes", "energy_j"},
    "memory": {"peak_used_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "headroom_bytes",
               "fragmentation_bytes"},
    "time": {"steps", "step_time_s", "period_s", "gpu_busy_fraction"},
    "utilization": {"gpu_mean_pct", "gpu_p95_pct", "memory_mean_pct"},
    "energy": {"energy_j", "source", "mean_power_w", "energy_per_step_j", "co2e_g"},
    "recommendations": {"kind", "summary", "reason", "saving"},
}


def _alibaba_steps(real_data, job: int, scale_s: float) -> StepSeries:
    """Real per-worker mini-batch times (normalised 0–1000) as hook steps, scaled to seconds."""
    df = pd.read_csv(real_data / f"cluster/alibaba-gpu-v2020/mini-batch-time/data/job_{job}_norm.csv", index_col=0)
    n = len(df)
    wall = df["batch_time_norm"].to_numpy(float) * scale_s
    return StepSeries(rank=df["worker"].to_numpy(float), step=df["time"].to_numpy(float),
                      ts=1.7e9 + df["time"].to_numpy(float), wall_s=wall, device_s=np.full(n, np.nan),
                      samples=np.full(n, 32.0), allocated_peak_bytes=np.full(n, np.nan),
                      reserved_peak_bytes=np.full(n, np.nan), memory_source=None)


@pytest.fixture(scope="module")
def real_job(real_data):
    gpus = [capture_series(real_data / "nvidia-smi" / c) for c in CAPTURES]
    for i, g in enumerate(gpus):
        g.uuid = f"GPU-{i}"  # the captures are masked to the same all-zero UUID
    steps = _alibaba_steps(real_data, 1, 0.01)
    layers = [LayerStat("layer1", "Conv2d", 0.2, 0.4, 10_000, 2), LayerStat("layer1", "Conv2d", 0.1, 0.2, 30_000, 2),
              LayerStat("fc", "Linear", 0.05, None, None, 4)]
    return JobData(job_id="j-real", state="finished", name="resnet", team="vision", started_at=None, ended_at=None,
                   exit_code=0, batch_size=32, gpu_type_requested=None, gpus_requested=3, gpus=gpus, steps=steps,
                   layers=layers)


def test_report_has_product_keys_and_is_strict_json(real_job):
    r = characterize(real_job, now=time.time())
    text = json.dumps(r, allow_nan=False)  # no NaN, no numpy scalars
    assert json.loads(text) == r
    assert PRODUCT_KEYS[""] <= r.keys()
    for block in ("memory", "time", "utilization", "energy"):
        assert PRODUCT_KEYS[block] <= r[block].keys(), block
    for g in r["gpus"]:
        assert PRODUCT_KEYS["gpus"] <= g.keys()
    assert r["recommendations"]
    for rec in r["recommendations"]:
        assert PRODUCT_KEYS["recommendations"] <= rec.keys()
    assert {"p50", "p95", "mean"} <= r["time"]["step_time_s"].keys()
    assert r["analyzer_version"] == ANALYZER_VERSION


def test_figures_against_independent_computation(real_job):
    r = characterize(real_job, now=time.time())
    per_gpu_peak = [float(np.nanmax(g.columns["memory_used_bytes"])) for g in real_job.gpus]
    assert r["memory"]["peak_used_bytes"] == max(per_gpu_peak)
    assert [g["peak_used_bytes"] for g in r["gpus"]] == per_gpu_peak
    assert r["memory"]["headroom_bytes"] == min(g.memory_total_bytes - p for g, p in zip(real_job.gpus, per_gpu_peak))
    trap = [float(np.sum(0.5 * (g.columns["power_w"][1:] + g.columns["power_w"][:-1]) * np.diff(g.ts)))
            for g in real_job.gpus]
    assert r["energy"]["energy_j"] == pytest.approx(sum(trap), rel=1e-9)
    assert r["energy"]["source"] == "integrated_power"
    assert r["sources"]["energy.energy_j"] == "integrated_power"
    assert r["sources"]["memory.peak_used_bytes"] == "nvml"
    util = np.concatenate([g.columns["gpu_util_pct"] for g in real_job.gpus])
    util = util[~np.isnan(util)]
    assert r["utilization"]["gpu_mean_pct"] == pytest.approx(util.mean())
    assert r["utilization"]["gpu_p95_pct"] == pytest.approx(np.percentile(util, 95))
    assert r["utilization"]["memory_mean_pct"] is None  # dmon's mem column is not in our replay: unknown
    assert r["time"]["gpu_busy_fraction"] == pytest.approx(util.mean() / 100)
    # 300 sampled iterations of 10 workers; the step time is the slowest worker's.
    assert r["time"]["steps"] == 300
    assert r["energy"]["energy_per_step_j"] == pytest.approx(sum(trap) / 300)
    assert r["energy"]["per_sample_j"] == pytest.approx(sum(trap) / 3000 / 32)
    span = max(g.ts[-1] for g in real_job.gpus) - min(g.ts[0] for g in real_job.gpus)
    assert r["duration_s"] == pytest.approx(span)
    assert r["time"]["layers"][0]["module"] == "layer1"
    assert r["time"]["layers"][0]["total_s"] == pytest.approx(0.9)
    assert r["time"]["layers"][0]["activation_bytes"] == 30_000


def test_running_job_duration_and_unknowns(real_job):
    job = JobData(**{**real_job.__dict__, "started_at": 1000.0, "ended_at": None, "steps": None, "layers": [],
                     "state": "running"})
    r = characterize(job, now=1600.0)
    assert r["duration_s"] == 600.0
    assert r["time"]["steps"] is None
    assert r["memory"]["peak_allocated_bytes"] is None
    assert r["energy"]["energy_per_step_j"] is None
    assert r["time"]["step_time_s"]["p95"] is None


def test_empty_job_is_all_unknown():
    job = JobData(job_id="empty", state="queued", name=None, team=None, started_at=None, ended_at=None,
                  exit_code=None, batch_size=None, gpu_type_requested=None, gpus_requested=None, gpus=[],
                  steps=None, layers=[])
    r = characterize(job, now=1.0)
    json.dumps(r, allow_nan=False)
    assert r["duration_s"] is None
    assert r["memory"]["peak_used_bytes"] is None and r["energy"]["energy_j"] is None
    assert r["utilization"]["gpu_mean_pct"] is None and r["time"]["period_s"] is None
    assert r["energy"]["co2e_g"] is None


def test_counter_with_reset_gives_mixed_source(real_data):
    """An H100 replay with a synthetic energy counter that resets once: counter intervals plus one
    integrated interval, source 'mixed', total equal to the independent sum."""
    g = capture_series(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    p = g.columns["power_w"]
    seg = 0.5 * (p[1:] + p[:-1]) * np.diff(g.ts)
    counter = np.concatenate([[7e5], 7e5 + np.cumsum(seg)])
    counter[6:] -= counter[6] - 1.0  # reset between sample 5 and 6
    g.columns["energy_counter_j"] = counter
    job = JobData(job_id="c", state="finished", name=None, team=None, started_at=None, ended_at=None, exit_code=0,
                  batch_size=None, gpu_type_requested=None, gpus_requested=1, gpus=[g], steps=None, layers=[])
    r = characterize(job, now=2e9)
    assert r["energy"]["source"] == "mixed" and r["energy"]["counter_resets"] == 1
    assert r["energy"]["energy_j"] == pytest.approx(float(seg.sum()))
    assert r["sources"]["energy.energy_j"] == "mixed"
