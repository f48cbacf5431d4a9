"""The PyTorch side of a job's fingerprint: the model's module tree, precision and framework version.

The rule itself (walk, hash, id) is `fleetprof.fingerprint`, shared with the estimator; this module only feeds
it what PyTorch knows. `ModelFingerprint.of(torch, model)` runs once, when the hooks find the model (one walk of
the module tree, no tensor touched); `fields(...)` builds the framework_info event's fingerprint fields each time
the event is sent (a sha256 of a few hundred bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetprof.fingerprint import describe_module, fingerprint_id, precision_of, tree_hash

FRAMEWORK = "pytorch"


@dataclass(frozen=True)
class ModelFingerprint:
    module_tree_hash: str
    module_count: int
    framework_version: str | None

    @classmethod
    def of(cls, torch: Any, model: Any) -> ModelFingerprint:
        tree = describe_module(model)
        version = getattr(torch, "__version__", None)
        return cls(module_tree_hash=tree_hash(tree), module_count=len(tree.modules),
                   framework_version=str(version)[:100] if version is not None else None)

    def fields(self, *, optimizers: list[str], autocast_dtype: str | None,
               parameter_dtype: str | None) -> dict[str, Any]:
        return {"fingerprint": fingerprint_id(self.module_tree_hash, optimizers),
                "module_tree_hash": self.module_tree_hash, "module_count": self.module_count,
                "framework": FRAMEWORK, "framework_version": self.framework_version,
                "precision_mode": precision_of(autocast_dtype=autocast_dtype, parameter_dtype=parameter_dtype)}
