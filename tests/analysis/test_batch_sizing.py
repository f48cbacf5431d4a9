"""Batch-size right-sizing from the `rightsizing_inputs` of a job name's runs (server/analysis/fleet/batch_sizing.py)."""

from __future__ import annotations

import pytest

from server.analysis.base.gpu_catalog import load_catalog
from server.analysis.fleet.batch_sizing import SAFETY_MARGIN_FRACTION, batch_size_advice, model_state_bytes

GIB, MIB = 2**30, 2**20
CATALOG = load_catalog()


def _run(batch: int, reserved: float, **kw: object) -> dict:
    return {"batch_size": batch, "peak_reserved_bytes": reserved, "memory_signal": "cuda_allocator", **kw}


def test_fit_over_two_sizes_recommends_the_largest_batch_that_keeps_the_margin() -> None:
    a, b, cap = 6 * GIB, 150 * MIB, 40 * GIB
    runs = [_run(16, a + 16 * b, memory_total_bytes=cap), _run(64, a + 64 * b, memory_total_bytes=cap)]
    advice = batch_size_advice(runs, CATALOG)
    assert advice is not None
    ev = advice.evidence
    assert ev["method"] == "fit" and ev["fixed_bytes"] == pytest.approx(a) and ev["per_sample_bytes"] == pytest.approx(b)
    best = ev["max_batch_size"]
    usable = cap * (1 - SAFETY_MARGIN_FRACTION)
    assert a + b * best <= usable < a + b * (best + 1)  # the largest that keeps 15 % free, worked out by hand here
    assert advice.summary == f"Batch size up to {best} fits (now 64)"
    assert advice.saving is not None and advice.saving["optimizer_steps_fraction"] == pytest.approx(1 - 64 / best)
    assert advice.saving["unused_bytes"] == pytest.approx(usable - (a + 64 * b))
    assert ev["capacity_source"] == "gpu_memory_total (nvml)"


def test_a_batch_that_does_not_fit_with_the_margin_is_flagged() -> None:
    a, b, cap = 30 * GIB, 1 * GIB, 40.5 * GIB
    runs = [_run(2, a + 2 * b, memory_total_bytes=cap), _run(8, a + 8 * b, memory_total_bytes=cap)]
    advice = batch_size_advice(runs, CATALOG)
    assert advice is not None and advice.evidence["max_batch_size"] == 4  # floor((34.4 GiB - 30 GiB) / 1 GiB)
    assert advice.summary.startswith("Batch size 8 leaves less than 15%") and advice.saving is None


def test_one_run_estimates_the_fixed_part_from_the_model_state() -> None:
    params = 100_000_000  # fp32 + Adam: weights, gradients, 2 moments = 16 B per parameter
    assert model_state_bytes({"parameter_count": params, "optimizers": ["Adam"], "precision": "float32"})[0] == \
        16 * params
    run = _run(32, 16 * params + 32 * 100 * MIB, gpu_name="NVIDIA A100-SXM4-80GB", parameter_count=params,
               optimizers=["Adam"], precision="float32", precision_source="parameters")
    advice = batch_size_advice([run], CATALOG)
    assert advice is not None and advice.evidence["method"] == "one_run_model_state"
    assert advice.evidence["per_sample_bytes"] == pytest.approx(100 * MIB)
    assert advice.evidence["capacity_source"].startswith("catalogue:")
    assert "lower bound" in advice.reason


def test_one_run_without_the_model_says_what_is_missing() -> None:
    advice = batch_size_advice([_run(32, 20 * GIB, memory_total_bytes=80 * GIB)], CATALOG)
    assert advice is not None and advice.saving is None
    assert advice.evidence["missing"] == ["a run at another batch size", "parameter_count", "optimizers"]
    assert batch_size_advice([{"peak_reserved_bytes": GIB}], CATALOG) is None  # no batch size: nothing to say


def test_cpu_run_is_sized_against_host_memory_from_its_rss() -> None:
    host = 16 * GIB
    runs = [{"batch_size": bs, "peak_reserved_bytes": 500 * MIB + bs * 2 * MIB, "memory_signal": "cpu_rss",
             "device_memory_total_bytes": host, "device_memory_source": "host_memory"} for bs in (8, 48)]
    advice = batch_size_advice(runs, CATALOG)
    assert advice is not None
    assert advice.evidence["memory_signal"] == ["peak_reserved_bytes (cpu_rss)"]
    assert advice.evidence["capacity_source"] == "hooks:host_memory"
    assert advice.evidence["max_batch_size"] == int((host * 0.85 - 500 * MIB) // (2 * MIB))
