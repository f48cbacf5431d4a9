"""What right-sizing needs, read by the hooks from an unmodified script (tests/hooks/scripts/train_loader.py)."""

from __future__ import annotations

import re

from fleetprof.protocol import EventBatch
from tests.hooks.conftest import Recorder, run_script


def _printed(stdout: str, key: str) -> int:
    m = re.search(rf"^{key} (\d+)$", stdout, re.M)
    assert m, stdout
    return int(m.group(1))


def _latest_info(recorder: Recorder) -> dict:
    infos = recorder.events("framework_info")
    assert infos, recorder.bodies
    return infos[-1]


def test_batch_size_model_optimizer_precision_from_an_unmodified_script(recorder: Recorder) -> None:
    # 7 steps at batch 12 over a dataset of 37: the epoch's 4th batch is a short one (1 sample)
    run = run_script("train_loader.py", "12", "7", server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    for body in recorder.bodies:
        EventBatch.model_validate(body)  # the new event is valid on the wire
    steps = recorder.events("step")
    assert 1 in {s["samples"] for s in steps}  # the short batch was seen, and did not win
    info = _latest_info(recorder)
    assert info["batch_size"] == _printed(run.stdout, "BATCH") == 12
    assert info["batch_size_source"] == "dataloader"
    assert info["parameter_count"] == _printed(run.stdout, "PARAMS")
    assert info["model_class"] == "__main__.ConvNet"
    assert info["optimizers"] == ["Adam"]
    assert info["precision"] == "float32" and info["precision_source"] == "parameters"
    assert info["device"] == "cpu" and info["device_memory_source"] == "host_memory"
    assert info["device_memory_total_bytes"] > 0
    # sent when it changed only: not once per step
    assert len(recorder.events("framework_info")) < len(steps)


def test_autocast_dtype_is_the_precision(recorder: Recorder) -> None:
    run = run_script("train_loader.py", "8", "3", "--autocast", server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    info = _latest_info(recorder)
    assert info["precision"] == "bfloat16" and info["precision_source"] == "autocast"
    assert info["batch_size"] == 8


def _convnet_step_flops(batch: int) -> int:
    """FLOPs of one training step of train_loader.py's ConvNet on 64x64 inputs, by hand: 2 per multiply-add; the
    backward computes each layer's weight gradient and (but for the first layer, whose input needs none) its input
    gradient, each as many FLOPs as the forward. ReLU, pooling, the loss and Adam are not counted (as in MFU)."""
    conv1 = 2 * batch * 16 * (3 * 3 * 3) * 64 * 64
    conv2 = 2 * batch * 16 * (16 * 3 * 3) * 64 * 64
    head = 2 * batch * (16 * 4 * 4) * 10
    return 3 * (conv1 + conv2 + head) - conv1


def test_flops_of_one_step_counted_once(recorder: Recorder) -> None:
    run = run_script("train_loader.py", "12", "5", server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    info = _latest_info(recorder)
    assert info["flops_per_step"] == _convnet_step_flops(12)
    assert info["flops_per_step_source"].startswith("torch.utils.flop_counter")


def test_flop_count_can_be_switched_off(recorder: Recorder) -> None:
    run = run_script("train_loader.py", "12", "3", server_url=recorder.url,
                     extra_env={"FLEETPROF_HOOKS_FLOP_COUNT": "false"})
    assert run.returncode == 0, run.stderr
    assert "flops_per_step" not in _latest_info(recorder)


def test_flop_count_skips_compiled_models_and_other_traces() -> None:
    from types import SimpleNamespace

    from agent.hooks.flops import StepFlops

    for kwargs in ({"other_trace_active": True}, {"other_trace_active": False,
                                                  "model": SimpleNamespace(_orig_mod=object())}):
        flops = StepFlops(None)  # torch is never touched on these paths
        flops.tick(1, **kwargs)  # type: ignore[arg-type]
        assert flops.done and flops.flops_per_step is None
    late = StepFlops(None)
    late.tick(5, other_trace_active=False)  # step 1 missed (hooks installed late): no partial count
    assert late.done and late.flops_per_step is None
