"""Issue #21 on a real GPU: the same script on CUDA and on the CPU sends one fingerprint (the device is
configuration, not the model)."""

from __future__ import annotations

from tests.hooks.conftest import Recorder, run_script


def _info(recorder: Recorder, device: str) -> dict:
    recorder.bodies.clear()
    run = run_script("train_cnn.py", "4", device, server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    return recorder.events("framework_info")[-1]


def test_cuda_and_cpu_runs_share_a_fingerprint(recorder: Recorder, cuda_torch) -> None:
    cuda, cpu = _info(recorder, "cuda"), _info(recorder, "cpu")
    assert cuda["device"].startswith("cuda") and cpu["device"] == "cpu"
    assert cuda["fingerprint"] == cpu["fingerprint"] is not None
    assert cuda["module_tree_hash"] == cpu["module_tree_hash"] and cuda["precision_mode"] == "fp32"
