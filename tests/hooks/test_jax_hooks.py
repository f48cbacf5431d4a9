"""The JAX hooks in a real JAX process through the recording collector: the step marker (`fleetprof_step`) and the
decorator (`train_step`), and nothing from them in a process that marks no step."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from agent.hooks.fingerprint import ModelFingerprint
from fleetprof.fingerprint import fingerprint_id
from fleetprof.protocol import EventBatch
from tests.hooks.conftest import Recorder, run_script


@pytest.mark.parametrize("mode", ["decorator", "marker"])
def test_jax_steps_samples_and_memory(recorder: Recorder, tmp_path: Path, mode: str) -> None:
    out = tmp_path / "own.json"
    run = run_script("train_jax.py", str(out), "12", "32", mode, server_url=recorder.url, timeout_s=240)
    assert run.returncode == 0, run.stderr[-3000:]
    own = json.loads(out.read_text())
    for body in recorder.bodies:
        EventBatch.model_validate(body)
    steps = recorder.events("step")
    assert [e["step"] for e in steps] == list(range(12))
    assert [e["samples"] for e in steps] == own["batch_sizes"] == [32] * 11 + [16]
    assert all(e["wall_s"] > 0 for e in steps) and steps[1]["memory_source"] == "cpu_rss"
    (start,) = recorder.events("job_start")
    assert start["framework"].startswith("jax ") and start["device"] == "cpu:0"
    info = recorder.events("framework_info")[-1]
    assert info["batch_size"] == 32 and info["batch_size_source"] == "forward_input"
    assert info["framework"] == "jax" and info["framework_version"] == jax.__version__
    if mode == "marker":  # no parameter pytree at hand: unknown
        assert "fingerprint" not in info and "module_tree_hash" not in info
    else:  # the update's first argument, train_jax.py's params: the same tree as this one, whatever the batch
        expected = ModelFingerprint.of_pytree(jax, _train_jax_params())
        assert info["module_tree_hash"] == expected.module_tree_hash and info["module_count"] == 1
        assert info["fingerprint"] == fingerprint_id(expected.module_tree_hash, [])
        assert info["parameter_count"] == 256 * 1024 + 1024 + 1024 * 10 + 10 and info["precision_mode"] == "fp32"


def _train_jax_params() -> dict[str, np.ndarray]:
    """train_jax.py's parameter shapes (numpy arrays: the tree's paths and shapes are all the rule reads)."""
    return {"w1": np.zeros((256, 1024), "float32"), "b1": np.zeros(1024, "float32"),
            "w2": np.zeros((1024, 10), "float32"), "b2": np.zeros(10, "float32")}


@pytest.mark.parametrize("mode", ["decorator", "marker"])
def test_a_jax_step_at_another_batch_size_has_the_same_fingerprint(recorder: Recorder, tmp_path: Path,
                                                                   mode: str) -> None:
    """The decorator reads its first argument; the marker the tree it is handed (`params=`)."""
    run = run_script("train_jax.py", str(tmp_path / "own.json"), "3", "8", *(["marker", "params"] if mode == "marker"
                                                                             else []),
                     server_url=recorder.url, timeout_s=240)
    assert run.returncode == 0, run.stderr[-3000:]
    info = recorder.events("framework_info")[-1]
    assert info["batch_size"] == 8
    assert info["fingerprint"] == fingerprint_id(ModelFingerprint.of_pytree(jax, _train_jax_params()).module_tree_hash,
                                                 [])


def test_jax_imported_without_a_marked_step_sends_nothing(recorder: Recorder) -> None:
    run = run_script("jax_no_steps.py", server_url=recorder.url)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "INSTALLED True 6.0" in run.stdout  # the hooks were there, and announced nothing: Keras imports jax too
    assert recorder.events() == []
