"""The characterization across configurations (server.analysis.configurations): configurations from runs, medians,
cost and MFU from the catalogue, and findings between configurations that differ in exactly one axis."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from server.analysis.base.gpu_catalog import find_model
from server.analysis.configurations import characterize_configurations

FP = "0123456789abcdef0123"
GIB = 2**30


def _report(job_id: str, *, gpu: str | None, gpus: int = 1, step_s: float | None, batch: int,
            precision: str = "fp32", energy_per_step_j: float | None = None, peak: int | None = None,
            framework_version: str = "2.13.0", device: str = "cuda:0") -> dict[str, Any]:
    per_sample = energy_per_step_j / batch if energy_per_step_j is not None else None
    return {
        "job_id": job_id, "name": "train", "state": "finished", "batch_size": batch,
        "gpus": [{"name": gpu} for _ in range(gpus)] if gpu else [],
        "time": {"steps": 100, "step_time_s": {"p50": step_s, "p95": step_s},
                 "samples_per_s": batch / step_s if step_s else None},
        "memory": {"peak_used_bytes": peak if gpu else None, "memory_total_bytes": 80 * GIB if gpu else None,
                   "headroom_bytes": 80 * GIB - peak if gpu and peak else None,
                   "peak_reserved_bytes": peak},
        "energy": {"energy_per_step_j": energy_per_step_j, "per_sample_j": per_sample, "source": "hardware_counter",
                   "energy_j": energy_per_step_j, "mean_power_w": None, "pue": 1.2, "price_per_kwh_usd": 0.12},
        "utilization": {"gpu_mean_pct": 80.0 if gpu else None},
        "framework": {"device": device, "device_memory_total_bytes": 64 * GIB},
        "fingerprint": {"fingerprint": FP, "model_class": "m.Net", "parameter_count": 1000, "precision": precision,
                        "framework": "pytorch", "framework_version": framework_version},
    }


def _run(job_id: str, metadata: dict[str, Any] | None = None, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    report = _report(job_id, **kw)
    return ({"job_id": job_id, "name": "train", "state": "finished", "framework": "pytorch",
             "batch_size": report["batch_size"], "metadata": metadata or {}}, report)


def test_one_axis_findings_with_ratios_and_units() -> None:
    runs = [
        _run("a1", gpu="A100-80GB", step_s=0.20, batch=64, energy_per_step_j=60.0, peak=20 * GIB),
        _run("a2", gpu="A100-80GB", step_s=0.24, batch=64, energy_per_step_j=70.0, peak=22 * GIB),
        _run("bf", gpu="A100-80GB", step_s=0.13, batch=64, precision="amp_bf16", energy_per_step_j=35.0,
             peak=14 * GIB),
        _run("big", gpu="A100-80GB", step_s=0.38, batch=128, energy_per_step_j=118.0, peak=36 * GIB),
        _run("h", gpu="H100-80GB", step_s=0.11, batch=64, energy_per_step_j=52.0, peak=20 * GIB),
    ]
    out = characterize_configurations(runs, fingerprint=FP)
    assert out.fingerprint == FP and out.model_class == "m.Net" and out.runs_total == 5
    assert set(out.axes_varied) == {"gpu_type", "batch_size", "precision"}
    base = next(c for c in out.configurations if c.job_ids == ["a1", "a2"])
    assert base.runs == 2 and base.step_time_s == pytest.approx(statistics.median([0.20, 0.24]))
    assert base.energy_per_step_j == pytest.approx(65.0)
    price = find_model("A100-80GB").price_per_hour_usd
    assert base.cost_per_step_usd == pytest.approx(price * 1 * 0.22 / 3600)
    assert base.energy_cost_per_step_usd == pytest.approx(65.0 / 3.6e6 * 1.2 * 0.12)

    by_axis = {f.axis: f for f in out.findings}
    assert set(by_axis) == {"precision", "gpu_type", "batch_size"}  # bf vs big differ in two axes: no finding
    assert len(out.findings) == 3
    prec = by_axis["precision"]
    assert (prec.from_value, prec.to_value) == ("fp32", "amp_bf16")
    ratios = {r.figure: r for r in prec.ratios}
    assert ratios["samples_per_s"].ratio == pytest.approx((64 / 0.13) / base.samples_per_s)
    assert ratios["energy_per_sample_j"].ratio == pytest.approx((35.0 / 64) / (65.0 / 64))
    assert ratios["samples_per_s"].unit == "samples/s" and ratios["energy_per_sample_j"].unit == "J/sample"
    assert "mfu_fraction" not in ratios  # unknown on both sides: no ratio, not 0
    assert f"{ratios['samples_per_s'].ratio:.2f}x the throughput (samples/s)" in prec.summary
    assert "A100-80GB" in prec.summary and "batch 64" in prec.summary
    gpu = by_axis["gpu_type"]
    assert (gpu.from_value, gpu.to_value) == ("A100-80GB", "H100-80GB")
    cost = next(r for r in gpu.ratios if r.figure == "cost_per_step_usd")
    h100 = find_model("H100-80GB").price_per_hour_usd
    assert cost.ratio == pytest.approx((h100 * 0.11) / (price * 0.22))
    assert (by_axis["batch_size"].from_value, by_axis["batch_size"].to_value) == ("batch 64", "batch 128")


def test_cpu_runs_unknown_price_and_mfu_from_a_stored_estimate() -> None:
    estimate = {"flops_per_step": 3.0e12, "batch_size": 32}
    runs = [
        _run("cpu8", gpu=None, step_s=0.5, batch=8, peak=1 * GIB, device="cpu"),
        _run("cpu16", gpu=None, step_s=0.9, batch=16, peak=2 * GIB, device="cpu"),
        _run("t4", gpu="T4", step_s=0.2, batch=64, energy_per_step_j=10.0, peak=5 * GIB,
             metadata={"estimate": estimate}),
        _run("odd", gpu="Mystery GPU", step_s=0.2, batch=64, peak=5 * GIB),
    ]
    out = characterize_configurations(runs, fingerprint=FP)
    rows = {r.job_id: r for r in out.runs}
    cpu = rows["cpu8"]
    assert (cpu.gpu_type, cpu.gpu_count) == ("cpu", 0)
    assert cpu.cost_per_step_usd is None and cpu.energy_per_step_j is None and cpu.mfu_fraction is None
    assert cpu.peak_memory_bytes == GIB and cpu.headroom_bytes == 63 * GIB  # RSS against the host's memory
    t4 = rows["t4"]
    assert t4.mfu_fraction == pytest.approx(3.0e12 * 64 / 32 / 0.2 / find_model("T4").peak_flops("fp32"))
    assert t4.mfu_source is not None and rows["odd"].mfu_fraction is None
    assert rows["odd"].cost_per_step_usd is None
    assert any("price_per_hour_usd" in n for n in out.notes)
    (batch,) = [f for f in out.findings if f.axis == "batch_size"]
    assert (batch.from_value, batch.to_value) == ("batch 8", "batch 16")
    assert {r.figure for r in batch.ratios} == {"samples_per_s", "step_time_s", "peak_memory_bytes"}


def test_framework_versions_are_an_axis_and_mixed_fingerprints_are_noted() -> None:
    a = _run("old", gpu="L40S", step_s=0.3, batch=32, framework_version="2.12.0")
    b = _run("new", gpu="L40S", step_s=0.25, batch=32, framework_version="2.13.0")
    b[1]["fingerprint"]["fingerprint"] = "f" * 20
    out = characterize_configurations([a, b], fingerprint=None)
    assert out.fingerprint is None and any("fingerprints" in n for n in out.notes)
    (f,) = out.findings
    assert f.axis == "framework" and (f.from_value, f.to_value) == ("pytorch 2.12.0", "pytorch 2.13.0")
    step = next(r for r in f.ratios if r.figure == "step_time_s")
    assert step.ratio == pytest.approx(0.25 / 0.3) and step.unit == "s"


def test_precision_from_the_framework_section_when_no_fingerprint_section() -> None:
    old = _run("old", gpu="T4", step_s=0.3, batch=32)
    del old[1]["fingerprint"]
    old[1]["framework"].update(precision="bfloat16", precision_source="autocast")
    plain = _run("plain", gpu="T4", step_s=0.3, batch=32)
    del plain[1]["fingerprint"]
    plain[1]["framework"].update(precision="float32", precision_source="parameters")
    rows = {r.job_id: r for r in characterize_configurations([old, plain], fingerprint=None).runs}
    assert (rows["old"].precision, rows["plain"].precision) == ("amp_bf16", "fp32")
    assert rows["old"].framework == "pytorch"  # the job's own framework field without a fingerprint section


def test_compare_rows_carry_precision_and_fingerprint() -> None:
    """GET /jobs/compare's rows: the precision is a setup field, other fingerprints a finding."""
    from server.analysis.compare import compare_runs

    fp32 = _run("fp32", gpu="A100-80GB", step_s=0.2, batch=64, energy_per_step_j=60.0, peak=20 * GIB)
    bf16 = _run("bf16", gpu="A100-80GB", step_s=0.12, batch=64, precision="amp_bf16", energy_per_step_j=33.0,
                peak=14 * GIB)
    bf16[0]["name"] = "renamed"
    out = compare_runs([fp32, bf16])
    assert [r.precision for r in out.jobs] == ["fp32", "amp_bf16"] and out.jobs[1].fingerprint == FP
    assert out.jobs[1].differs_from_baseline == ["precision"]
    assert not any("different names" in f for f in out.findings)  # one fingerprint: the same model
    other = _run("other", gpu="A100-80GB", step_s=0.2, batch=64)
    other[1]["fingerprint"]["fingerprint"] = "e" * 20
    assert any("2 different model fingerprints" in f for f in compare_runs([fp32, other]).findings)
