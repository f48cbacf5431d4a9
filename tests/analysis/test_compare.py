"""Run comparison: figures read from real characterization reports, ratios against the first run, findings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.analysis.base.jobdata import JobData, StepSeries
from server.analysis.characterize import characterize
from server.analysis.compare import compare_runs, ratio, run_row

from .realdata import capture_series

H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
L40S = "linux-x86_64__nvidia-l40s__595.80.txt"


def _steps(n: int, wall_s: float, batch: int, t0: float, *, alloc: float | None = None) -> StepSeries:
    a = np.arange(n, dtype=np.float64)
    nan = np.full(n, np.nan)
    return StepSeries(rank=np.zeros(n), step=a, ts=t0 + a * wall_s, wall_s=np.full(n, wall_s), device_s=nan,
                      samples=np.full(n, float(batch)), allocated_peak_bytes=nan if alloc is None else np.full(n, alloc),
                      reserved_peak_bytes=nan if alloc is None else np.full(n, alloc * 1.25), memory_source=None)


def _report(real_data, capture: str, job_id: str, *, steps: StepSeries | None, batch: int | None) -> dict:
    g = capture_series(real_data / "nvidia-smi" / capture)
    job = JobData(job_id=job_id, state="finished", name="resnet50", team="vision", started_at=None, ended_at=None,
                  exit_code=0, batch_size=batch, gpu_type_requested=None, gpus_requested=1, gpus=[g], steps=steps,
                  layers=[])
    return characterize(job, now=2e9)


def _meta(report: dict, framework: str = "pytorch") -> dict:
    return {"job_id": report["job_id"], "name": report["name"], "team": report["team"], "framework": framework,
            "batch_size": report["batch_size"], "state": report["state"]}


@pytest.fixture(scope="module")
def reports(real_data):
    """A: H100, batch 32, 0.20 s/step; B: L40S, batch 64, 0.50 s/step; C: L40S with no hook steps."""
    a = _report(real_data, H100, "a", steps=_steps(200, 0.20, 32, 1.7e9, alloc=30 * 2**30), batch=32)
    b = _report(real_data, L40S, "b", steps=_steps(120, 0.50, 64, 1.7e9), batch=64)
    c = _report(real_data, L40S, "c", steps=None, batch=64)
    return a, b, c


def test_figures_are_the_reports_own(reports):
    a, _, _ = reports
    row = run_row(_meta(a), a)
    assert row["gpu_name"] == a["gpus"][0]["name"] and row["gpu_count"] == 1
    assert row["peak_used_bytes"] == a["memory"]["peak_used_bytes"]
    assert row["peak_allocated_bytes"] == 30 * 2**30 and row["peak_reserved_bytes"] == int(30 * 2**30 * 1.25)
    assert row["step_time_p50_s"] == a["time"]["step_time_s"]["p50"] == pytest.approx(0.20)
    assert row["step_time_p95_s"] == a["time"]["step_time_s"]["p95"]
    assert row["samples_per_s"] == a["time"]["samples_per_s"] == pytest.approx(32 / 0.20)
    assert row["energy_j"] == a["energy"]["energy_j"] and row["energy_source"] == "integrated_power"
    assert row["energy_per_step_j"] == a["energy"]["energy_per_step_j"]
    assert row["energy_per_sample_j"] == a["energy"]["per_sample_j"]
    assert row["energy_per_sample_j"] == pytest.approx(a["energy"]["energy_j"] / (200 * 32))
    assert row["mean_power_w"] == a["energy"]["mean_power_w"]
    assert row["gpu_util_mean_pct"] == a["utilization"]["gpu_mean_pct"]


def test_ratios_against_the_first_run_and_findings(reports):
    a, b, c = reports
    out = compare_runs([(_meta(a), a), (_meta(b), b), (_meta(c), c)]).model_dump(mode="json")
    json.dumps(out, allow_nan=False)
    assert out["baseline_job_id"] == "a" and [r["job_id"] for r in out["jobs"]] == ["a", "b", "c"]
    ra, rb, rc = out["jobs"]
    assert all(v == 1.0 for v in ra["vs_baseline"].values() if v is not None) and ra["differs_from_baseline"] == []
    vb = rb["vs_baseline"]
    assert vb["step_time_ratio"] == pytest.approx(0.50 / 0.20)
    assert vb["samples_per_s_ratio"] == pytest.approx((64 / 0.5) / (32 / 0.2))
    assert vb["energy_per_sample_ratio"] == pytest.approx(b["energy"]["per_sample_j"] / a["energy"]["per_sample_j"])
    assert vb["peak_used_ratio"] == pytest.approx(b["memory"]["peak_used_bytes"] / a["memory"]["peak_used_bytes"])
    assert set(rb["differs_from_baseline"]) == {"gpu_name", "batch_size"}
    # C has no steps: its per-step figures are unknown, not 0, and so are their ratios.
    assert rc["step_time_p50_s"] is None and rc["energy_per_sample_j"] is None and rc["samples_per_s"] is None
    assert rc["vs_baseline"]["step_time_ratio"] is None and rc["vs_baseline"]["energy_per_sample_ratio"] is None
    assert rc["vs_baseline"]["peak_used_ratio"] is not None
    fb = out["findings"][0]
    assert fb.startswith(f"b is {vb['step_time_ratio']:.2f}x slower per step than a at "
                         f"{vb['energy_per_sample_ratio']:.2f}x the energy per sample")
    assert "throughput" in fb and "batch 64" in fb and "batch 32" in fb
    assert out["findings"][1].startswith("c has no step time to compare with a")
    assert any("no framework step times for c" in f for f in out["findings"])
    assert out["best"]["fastest_per_step"] == "a" and out["best"]["highest_throughput"] == "a"


def test_faster_run_reads_faster_and_unknown_is_null():
    def rep(job_id: str, p50: float | None, per_sample: float | None, peak: int | None) -> dict:
        return {"job_id": job_id, "name": "m", "gpus": [],
                "time": {"step_time_s": {"p50": p50, "p95": None}, "samples_per_s": None, "steps": None},
                "energy": {"energy_j": None, "per_sample_j": per_sample, "energy_per_step_j": None},
                "memory": {"peak_used_bytes": peak}, "utilization": {},
                "rightsizing_inputs": {"gpu_name": "NVIDIA A100-SXM4-80GB", "gpu_count": 4}}

    out = compare_runs([({"job_id": "A"}, rep("A", 0.9, 2.0, 40 * 2**30)),
                        ({"job_id": "B"}, rep("B", 0.5, 2.6, None))]).model_dump()
    b = out["jobs"][1]
    assert out["findings"][0].startswith("B is 1.80x faster per step than A at 1.30x the energy per sample")
    assert b["vs_baseline"]["peak_used_ratio"] is None and b["peak_used_bytes"] is None
    assert b["gpu_name"] == "NVIDIA A100-SXM4-80GB" and b["gpu_count"] == 4  # requested, no telemetry
    assert b["energy_j"] is None and b["vs_baseline"]["energy_per_step_ratio"] is None
    assert out["best"]["least_energy_per_sample"] == "A" and out["best"]["smallest_peak_memory"] is None


def test_ratio_edges_and_different_models_are_flagged():
    assert ratio(None, 1.0) is None and ratio(1.0, None) is None and ratio(1.0, 0.0) is None
    assert ratio(3.0, 2.0) == 1.5
    empty = {"gpus": [], "time": {}, "energy": {}, "memory": {}, "utilization": {}}
    out = compare_runs([({"job_id": "x", "name": "bert"}, empty), ({"job_id": "y", "name": "gpt2"}, empty)])
    assert any("different names (bert, gpt2)" in f for f in out.findings)
    with pytest.raises(ValueError):
        compare_runs([])
