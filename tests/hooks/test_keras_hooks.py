"""The Keras hooks in a real Keras 3 process (JAX and torch backends), through the recording collector: how users
call `fit` (callbacks positionally, a CallbackList, several batches per execution) and torch imported before keras.
"""

from __future__ import annotations

import pytest

from fleetprof.protocol import EventBatch
from tests.hooks.conftest import Recorder, run_script

BATCHES = 20  # keras_variants.py: 2 epochs of 100 samples at batch size 10


def _run(recorder: Recorder, variant: str, backend: str) -> str:
    run = run_script("keras_variants.py", variant, server_url=recorder.url, timeout_s=240,
                     extra_env={"KERAS_BACKEND": backend, "FLEETPROF_HOOKS_LAYER_EVERY": "5"})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.parametrize("variant", ["positional", "callbacklist"])
def test_every_way_of_passing_callbacks_keeps_the_users_and_adds_ours(recorder: Recorder, variant: str) -> None:
    out = _run(recorder, variant, "jax")
    assert f"CALLS {BATCHES}" in out  # the user's own callback still ran on every batch
    for body in recorder.bodies:
        EventBatch.model_validate(body)
    steps = recorder.events("step")
    assert [e["step"] for e in steps] == list(range(BATCHES))
    assert all(e["samples"] == 10 for e in steps) and all(e["wall_s"] > 0 for e in steps)
    (start,) = recorder.events("job_start")
    assert start["framework"].startswith("keras 3.") and start["framework"].endswith("(jax backend)")
    layers = {e["module"] for e in recorder.events("layer")}
    assert layers == {"Sequential", "hidden", "out"}
    assert {e["step"] for e in recorder.events("layer")} == {1, 6, 11, 16}


def test_several_batches_per_execution_count_each_batch(recorder: Recorder) -> None:
    out = _run(recorder, "execution", "jax")
    assert "CALLS 8" in out  # Keras called the batch callbacks once per execution: ceil(10 / 3) per epoch
    steps = recorder.events("step")
    assert [e["step"] for e in steps] == list(range(BATCHES))  # still every optimizer step
    # the execution's time split evenly between its batches: equal walls within each execution
    by_ts: dict[float, set[float]] = {}
    for e in steps:
        by_ts.setdefault(e["ts"], set()).add(e["wall_s"])
    assert all(len(walls) == 1 for walls in by_ts.values())


def test_torch_imported_first_hands_over_to_keras(recorder: Recorder) -> None:
    _run(recorder, "torch-first", "torch")
    steps = recorder.events("step")
    assert [e["step"] for e in steps] == list(range(BATCHES))  # Keras's steps, once (torch's hooks stood down)
    frameworks = [e["framework"] for e in recorder.events("job_start")]
    # the PyTorch hooks announced the job when torch loaded; Keras says what it is when it loads
    assert frameworks[-1].endswith("(torch backend)") and len(frameworks) == 2
    assert len({b["source_id"] for b in recorder.bodies}) == 1  # one sender, handed over
    layers = [e for e in recorder.events("layer") if e["module"] == "hidden"]
    assert layers and all(e["forward_s"] > 0 for e in layers)  # eager torch backend: timed


def test_keras_announces_the_job_and_a_torch_loop_of_its_own_is_counted_by_the_torch_hooks(recorder: Recorder) -> None:
    """Keras imported torch (torch backend): Keras's hooks say what the job is; a loop that steps the Keras model with
    a torch optimizer (no fit) has its steps counted by the PyTorch hooks, which stayed on for it."""
    out = _run(recorder, "torch-loop", "torch")
    assert "CALLS 6" in out
    frameworks = [e["framework"] for e in recorder.events("job_start")]
    assert frameworks[0].startswith("keras 3.") and frameworks[0].endswith("(torch backend)")
    assert [e["step"] for e in recorder.events("step")] == list(range(6))
    assert all(e["samples"] == 10 for e in recorder.events("step"))
