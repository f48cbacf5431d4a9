"""Compare: the recommendations a run applied (`fleetprof run --apply`), predicted vs realized saving, from real
characterization reports."""

from __future__ import annotations

import numpy as np

from server.analysis.base.jobdata import JobData, StepSeries
from server.analysis.characterize import characterize
from server.analysis.compare import compare_runs

from .realdata import capture_series

H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
GIB = 2**30


def _report(real_data, job_id: str, reserved: float) -> dict:
    n = 50
    a = np.arange(n, dtype=np.float64)
    nan = np.full(n, np.nan)
    steps = StepSeries(rank=np.zeros(n), step=a, ts=1.7e9 + a * 0.2, wall_s=np.full(n, 0.2), device_s=nan,
                       samples=np.full(n, 32.0), allocated_peak_bytes=np.full(n, 20.0 * GIB),
                       reserved_peak_bytes=np.full(n, reserved), memory_source=None)
    g = capture_series(real_data / "nvidia-smi" / H100)
    job = JobData(job_id=job_id, state="finished", name="resnet50", team="vision", started_at=None, ended_at=None,
                  exit_code=0, batch_size=32, gpu_type_requested=None, gpus_requested=1, gpus=[g], steps=steps,
                  layers=[])
    return characterize(job, now=2e9)


def _meta(report: dict, applied=None) -> dict:
    return {"job_id": report["job_id"], "name": report["name"], "team": report["team"], "framework": "pytorch",
            "batch_size": report["batch_size"], "state": report["state"], "applied": applied}


APPLIED = [{"kind": "allocator_settings", "summary": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "predicted_saving": {"reserved_bytes": 8 * GIB, "reserved_pct": 25.0}, "from_job": "before",
            "setting": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"},
           {"kind": "batch_size", "summary": "Batch 64", "predicted_saving": None, "from_job": "elsewhere",
            "setting": "--batch-size 64"},
           "not a dict", {"kind": 3}]


def test_applied_recommendations_with_realized_saving(real_data):
    before, after = _report(real_data, "before", 32.0 * GIB), _report(real_data, "after", 24.0 * GIB)
    out = compare_runs([(_meta(before), before), (_meta(after, APPLIED), after)])
    base, run = out.jobs
    assert base.applied == []
    alloc, batch = run.applied  # the malformed entries are skipped
    assert alloc.kind == "allocator_settings" and alloc.from_job == "before"
    assert alloc.predicted_saving == {"reserved_bytes": 8 * GIB, "reserved_pct": 25.0}
    [mem] = alloc.realized
    assert (mem.figure, mem.unit, mem.against_job_id) == ("peak_reserved_bytes", "bytes", "before")
    assert mem.before == before["memory"]["peak_reserved_bytes"] and mem.after == after["memory"]["peak_reserved_bytes"]
    assert mem.saving == mem.before - mem.after > 0 and mem.saving_pct == 100 * mem.saving / mem.before
    # a job not among the compared runs: measured against the baseline; time and energy per step
    assert [r.figure for r in batch.realized] == ["step_time_p50_s", "energy_per_step_j"]
    assert batch.realized[0].against_job_id == "before" and batch.realized[0].saving is not None
    assert any(f.startswith("after applied allocator_settings (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): "
                            "peak_reserved_bytes") and "predicted" in f for f in out.findings)


def test_unknown_figure_gives_null_realized():
    before = {"job_id": "before", "memory": {"peak_reserved_bytes": 10 * GIB}}
    after = {"job_id": "after", "memory": {}}
    out = compare_runs([({"job_id": "before"}, before), ({"job_id": "after", "applied": APPLIED[:1]}, after)])
    [mem] = out.jobs[1].applied[0].realized
    assert mem.before == 10 * GIB and mem.after is None and mem.saving is None and mem.saving_pct is None
    assert any("not measurable" in f for f in out.findings)
