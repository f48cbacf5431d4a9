"""The fingerprint rule (fleetprof/fingerprint.py) over Keras layer trees and JAX parameter pytrees: real Keras 3 on
the torch and JAX backends, and TensorFlow's where the `tensorflow` extra is installed (a fresh interpreter each: a
process has one Keras backend), real JAX on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent.hooks.fingerprint import ModelFingerprint
from agent.hooks.jax import _majority_precision
from fleetprof.fingerprint import FINGERPRINT_PATTERN, describe_pytree, fingerprint_id

SCRIPT = Path(__file__).parent / "scripts" / "keras_fingerprint.py"


def _keras_cases(backend: str) -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def keras_cases() -> dict[str, dict]:
    return {backend: _keras_cases(backend) for backend in ("torch", "jax")}


def test_a_keras_model_has_one_fingerprint_on_the_torch_and_jax_backends(keras_cases: dict[str, dict]) -> None:
    torch_cases, jax_cases = keras_cases["torch"], keras_cases["jax"]
    assert torch_cases == jax_cases  # every case, every field: the trees, the ids, the precisions
    assert len({c["fingerprint"] for k, c in torch_cases.items() if k != "tree"}) == 4  # not one id for all
    assert all(re.match(FINGERPRINT_PATTERN, c["fingerprint"]) for k, c in torch_cases.items() if k != "tree")
    assert {c["framework"] for k, c in torch_cases.items() if k != "tree"} == {"keras"}


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="the `tensorflow` extra is not installed")
def test_and_on_the_tensorflow_backend(keras_cases: dict[str, dict]) -> None:
    assert _keras_cases("tensorflow") == keras_cases["torch"]


def test_what_a_keras_fingerprint_sees_and_what_it_leaves_out(keras_cases: dict[str, dict]) -> None:
    c = keras_cases["torch"]
    fp = c["seq_input"]["fingerprint"]
    # automatic layer names (dense_7 the second time), keras.Input, freezing, precision: not the model
    assert c["functional_again"]["fingerprint"] == c["functional"]["fingerprint"]
    assert c["seq_no_input"]["fingerprint"] == c["seq_frozen"]["fingerprint"] == fp
    assert c["seq_bf16"]["fingerprint"] == c["seq_f16"]["fingerprint"] == fp
    assert c["seq_f16"]["optimizer_seen"] == "LossScaleOptimizer"  # compile wrapped Adam; the id names Adam
    assert (c["seq_bf16"]["precision_mode"], c["seq_f16"]["precision_mode"], c["seq_input"]["precision_mode"]) == \
        ("amp_bf16", "amp_fp16", "fp32")
    # another width, another optimizer: other ids (the tree hash stays the model's own under another optimizer)
    assert c["seq_wide"]["fingerprint"] != fp and c["seq_wide"]["module_tree_hash"] != c["seq_input"]["module_tree_hash"]
    assert c["seq_sgd"]["fingerprint"] != fp and c["seq_sgd"]["module_tree_hash"] == c["seq_input"]["module_tree_hash"]
    # the tree: layers by position, InputLayer left out, the shared conv once, BatchNormalization's trainable weights
    modules = {m["path"]: m for m in c["tree"]["modules"]}
    assert [(p, m["type"]) for p, m in modules.items()] == [
        ("", "Functional"), ("0", "Sequential"), ("0.0", "Conv2D"), ("0.1", "BatchNormalization"), ("0.2", "ReLU"),
        ("1", "Conv2D"), ("2", "Flatten"), ("3", "Dense")]
    assert modules["0.1"]["params"] == [["gamma", [4]], ["beta", [4]]]  # moving statistics are buffers: out
    assert modules["1"]["params"] == [["kernel", [3, 3, 4, 4]], ["bias", [4]]]


def _params(width: int, dtype: str = "float32") -> dict:
    return {"Dense_0": {"kernel": jnp.zeros((8, width), dtype), "bias": jnp.zeros(width, dtype)},
            "head": [jnp.zeros((width, 2), dtype), jnp.zeros(2, dtype)]}


def test_a_jax_parameter_pytree_is_described_by_its_paths_and_shapes() -> None:
    tree = ModelFingerprint.of_pytree(jax, _params(16))
    assert tree.framework == "jax" and tree.framework_version == jax.__version__
    assert tree.module_count == 3 and tree.parameter_count == 8 * 16 + 16 + 16 * 2 + 2  # root, Dense_0, head
    leaves, _ = jax.tree_util.tree_flatten_with_path(_params(16))
    described = describe_pytree((tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in p), leaf)
                                for p, leaf in leaves)
    assert [(m.path, m.params) for m in described.modules] == [
        ("", []), ("Dense_0", [("bias", [16]), ("kernel", [8, 16])]), ("head", [("0", [16, 2]), ("1", [2])])]
    # dtype is precision, not the model; numpy arrays and jax arrays of one shape are one tree
    same = [ModelFingerprint.of_pytree(jax, _params(16, "bfloat16")),
            ModelFingerprint.of_pytree(jax, jax.tree_util.tree_map(np.asarray, _params(16)))]
    assert {t.module_tree_hash for t in same} == {tree.module_tree_hash}
    assert ModelFingerprint.of_pytree(jax, _params(32)).module_tree_hash != tree.module_tree_hash
    assert fingerprint_id(tree.module_tree_hash, []) != fingerprint_id(
        ModelFingerprint.of_pytree(jax, _params(32)).module_tree_hash, [])


def test_a_jax_argument_that_is_not_a_tree_of_arrays_has_no_fingerprint() -> None:
    for not_params in ({"lr": 0.1, "w": jnp.zeros(3)}, {}, [], "params"):
        with pytest.raises(ValueError):
            ModelFingerprint.of_pytree(jax, not_params)


def test_a_jax_trees_precision_is_the_dtype_of_most_of_its_floats() -> None:
    mixed = {"w": jnp.zeros((64, 64), jnp.bfloat16), "scale": jnp.zeros(64, jnp.float32), "step": jnp.zeros((), int)}
    assert _majority_precision(jax.tree_util.tree_leaves(mixed)) == "bf16"
    assert _majority_precision(jax.tree_util.tree_leaves(_params(4))) == "fp32"
    assert _majority_precision([jnp.zeros(3, jnp.int32)]) is None
