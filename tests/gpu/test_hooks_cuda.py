"""The PyTorch hooks on CUDA: allocator peaks, device time, per-layer activation memory (no code change)."""

from __future__ import annotations

from tests.hooks.conftest import Recorder, run_script

STEPS = 8


def test_cuda_allocator_peaks_and_device_time(recorder: Recorder, cuda_torch) -> None:
    run = run_script("train_cnn.py", str(STEPS), "cuda", server_url=recorder.url, level="layers",
                     extra_env={"FLEETPROF_HOOKS_LAYER_EVERY": "3", "FLEETPROF_HOOKS_ALLOC_TRACE_STEPS": "2"})
    assert run.returncode == 0, run.stderr
    steps = recorder.events("step")
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert all(s["memory_source"] == "cuda_allocator" and s["allocated_peak_bytes"] > 0
               and s["reserved_peak_bytes"] >= s["allocated_peak_bytes"] for s in steps)
    assert sum(s.get("device_s") is not None for s in steps) >= STEPS - 2  # step 0 may start before CUDA
    layers = {e["module"]: e for e in recorder.events("layer") if e["step"] == 4}
    assert layers["conv1"]["activation_bytes"] > 0 and layers["conv1"]["backward_s"] > 0
