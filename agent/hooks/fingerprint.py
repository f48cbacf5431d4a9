"""The hooks' side of a job's fingerprint: the model's module tree, precision and framework version.

The rule itself (walk, hash, id) is `fleetprof.fingerprint`, shared with the estimator; this module only feeds
it what each framework knows. `ModelFingerprint.of(torch, model)` (PyTorch), `.of_keras(keras, model)` (Keras 3,
any backend) and `.of_pytree(jax, tree)` (a JAX parameter pytree) run once, when the hooks find the model (one walk
of the tree, no tensor touched); `fields(...)` builds the framework_info event's fingerprint fields each time the
event is sent (a sha256 of a few hundred bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetprof.fingerprint import (
    ModuleTree,
    Precision,
    describe_keras_model,
    describe_module,
    describe_pytree,
    fingerprint_id,
    precision_of,
    tree_hash,
)

FRAMEWORK = "pytorch"
KERAS = "keras"
JAX = "jax"


@dataclass(frozen=True)
class ModelFingerprint:
    module_tree_hash: str
    module_count: int
    framework_version: str | None
    framework: str = FRAMEWORK
    parameter_count: int | None = None  # the tree's elements (sent by hooks that have no other count: JAX)

    @classmethod
    def of(cls, torch: Any, model: Any) -> ModelFingerprint:
        return cls.of_tree(describe_module(model), FRAMEWORK, torch)

    @classmethod
    def of_keras(cls, keras: Any, model: Any) -> ModelFingerprint:
        return cls.of_tree(describe_keras_model(model), KERAS, keras)

    @classmethod
    def of_pytree(cls, jax: Any, tree: Any) -> ModelFingerprint:
        """A JAX pytree of arrays (ValueError when a leaf is not an array, or there is none)."""
        leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
        return cls.of_tree(describe_pytree((tuple(_key(k) for k in path), leaf) for path, leaf in leaves),
                           JAX, jax)

    @classmethod
    def of_tree(cls, tree: ModuleTree, framework: str, module: Any) -> ModelFingerprint:
        version = getattr(module, "__version__", None)
        return cls(module_tree_hash=tree_hash(tree), module_count=len(tree.modules),
                   framework_version=str(version)[:100] if version is not None else None, framework=framework,
                   parameter_count=tree.parameter_count)

    def fields(self, *, optimizers: list[str], autocast_dtype: str | None = None,
               parameter_dtype: str | None = None, precision_mode: Precision | None = None) -> dict[str, Any]:
        """`precision_mode` given: as it is; else from the autocast and parameter dtypes."""
        mode = precision_mode if precision_mode is not None else \
            precision_of(autocast_dtype=autocast_dtype, parameter_dtype=parameter_dtype)
        return {"fingerprint": fingerprint_id(self.module_tree_hash, optimizers),
                "module_tree_hash": self.module_tree_hash, "module_count": self.module_count,
                "framework": self.framework, "framework_version": self.framework_version,
                "precision_mode": mode}


def _key(entry: Any) -> str:
    """One step of a JAX key path as text: a dict key, an attribute name, a sequence index."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def keras_precision(policy: Any) -> Precision | None:
    """A Keras dtype policy's precision: `mixed_float16` / `mixed_bfloat16` (compute dtype other than the
    variables') are Keras's autocast, amp_fp16 / amp_bf16; otherwise the compute dtype (`float32` -> fp32)."""
    compute, variable = getattr(policy, "compute_dtype", None), getattr(policy, "variable_dtype", None)
    if not compute:
        return None
    mixed = variable is not None and str(variable) != str(compute)
    return precision_of(autocast_dtype=str(compute) if mixed else None, parameter_dtype=str(compute))


def keras_optimizer_name(optimizer: Any) -> str:
    """The optimizer's class name, inside Keras's LossScaleOptimizer (which `compile` wraps around the optimizer
    under a mixed_float16 policy: a precision, not another optimizer)."""
    for _ in range(4):
        inner = getattr(optimizer, "inner_optimizer", None)
        if inner is None:
            break
        optimizer = inner
    return type(optimizer).__name__[:200]
