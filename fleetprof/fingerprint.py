"""A model's fingerprint: one id shared by every run of the same model, whatever the configuration it ran in.

The ONE rule, used by the training hooks (agent/hooks/fingerprint.py for PyTorch; other frameworks' hooks build
the same `ModuleTree` from their layers) and by the estimator (server/estimate) for a registered or zoo model:

- `describe_module(module)` walks any object with PyTorch's module protocol (`named_children()`,
  `named_parameters(recurse=False)`, parameters with a `shape`) into a `ModuleTree`: per module, in registration
  order, its path, its type's `__qualname__` and its own parameters' names and shapes. Pure duck typing: this
  package never imports torch. Known wrappers (DistributedDataParallel, DataParallel, `torch.compile`) are
  unwrapped first: the GPU count and compilation are configuration, not the model.
- `tree_hash(tree)`: sha256 over that description (types and shapes only). Parameter dtypes and buffers are left
  out: bf16 weights are a precision, and buffers such as attention masks may depend on the sequence length.
  Types are named by `__qualname__` without their module, so a class reads the same whether a script runs it as
  `__main__` or the estimator imports it from its module; Hugging Face's per-implementation attention classes of
  transformers 4.36-4.47 (`LlamaSdpaAttention`, `LlamaFlashAttention2`) read as the plain one (`LlamaAttention`,
  the only class in later versions): the attention kernel is configuration, as the framework version is.
- `fingerprint_id(tree_hash, optimizers)`: the job's fingerprint, the tree hash and the sorted optimizer class
  names. It leaves out, on purpose, every configuration axis runs are compared across: batch size, GPU type and
  count, precision (fp32/bf16/fp16/amp) and the framework's version. Two models of the same architecture at other
  widths differ (their shapes do).

Format: 20 lowercase hex characters (80 bits of sha256), `FINGERPRINT_PATTERN`. `RULE_VERSION` is hashed in: a
change of rule gives new ids, never a silent collision with the old ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

RULE_VERSION: Final = 1
FINGERPRINT_LENGTH: Final = 20
FINGERPRINT_PATTERN: Final = r"^[0-9a-f]{20}$"
MAX_MODULES: Final = 100_000  # a description past this is cut (the hash says so: `truncated`)
# Attributes under which wrappers keep the model they wrap: DDP and DataParallel `.module`, torch.compile's
# OptimizedModule `._orig_mod`. Unwrapped only when the wrapper's type is one of WRAPPER_TYPES.
WRAPPER_TYPES: Final = {"DistributedDataParallel": "module", "DataParallel": "module",
                        "OptimizedModule": "_orig_mod"}

Precision = Literal["fp32", "fp16", "bf16", "fp64", "amp_fp16", "amp_bf16", "other"]
"""The compute precision of a run: parameters' dtype (fp32, fp16, bf16, fp64) or autocast's (amp_fp16, amp_bf16)."""


class ModuleNode(BaseModel):
    """One module of the tree: its dotted path ("" for the root), its type's qualname, its own parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    type: str
    params: list[tuple[str, list[int]]] = Field(description="(name, shape) of the module's own parameters")


class ModuleTree(BaseModel):
    """A model as the fingerprint sees it: modules in walk order (parents before children)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root_type: str
    modules: list[ModuleNode]
    parameter_count: int = Field(description="distinct parameters' elements (a tied weight counts once)")
    truncated: bool = False


def unwrap(module: Any) -> Any:
    """The model inside known wrappers (nested ones too)."""
    for _ in range(8):
        attr = WRAPPER_TYPES.get(type(module).__name__)
        inner = getattr(module, attr, None) if attr else None
        if inner is None:
            return module
        module = inner
    return module


def model_class(module: Any) -> str:
    """module.qualname of the model's type (inside known wrappers), at most 500 characters."""
    cls = type(unwrap(module))
    return f"{cls.__module__}.{cls.__qualname__}"[:500]


_ATTENTION_IMPL = re.compile(r"(?:Sdpa|Flash)((?:Self)?Attention)2?$")


def type_name(module: Any) -> str:
    """The name a module's type has in the description (see the module docstring)."""
    return _ATTENTION_IMPL.sub(r"\1", type(module).__qualname__)


def _shape(param: Any) -> list[int]:
    return [int(d) for d in getattr(param, "shape", ())]


def describe_module(module: Any) -> ModuleTree:
    """The `ModuleTree` of a PyTorch-like module (see the module docstring); wrappers unwrapped."""
    root = unwrap(module)
    nodes: list[ModuleNode] = []
    seen_params: set[int] = set()
    count = 0
    stack: list[tuple[str, Any]] = [("", root)]
    truncated = False
    while stack:
        if len(nodes) >= MAX_MODULES:
            truncated = True
            break
        path, mod = stack.pop()
        params = []
        for name, p in mod.named_parameters(recurse=False):
            params.append((name, _shape(p)))
            if id(p) not in seen_params:
                seen_params.add(id(p))
                n = 1
                for d in _shape(p):
                    n *= d
                count += n
        nodes.append(ModuleNode(path=path, type=type_name(mod), params=params))
        children = [(f"{path}.{name}" if path else name, child) for name, child in mod.named_children()]
        stack.extend(reversed(children))  # depth first, in registration order
    return ModuleTree(root_type=type_name(root), modules=nodes, parameter_count=count, truncated=truncated)


def tree_hash(tree: ModuleTree) -> str:
    """sha256 (hex) of the tree's types and shapes."""
    doc = {"rule": RULE_VERSION, "truncated": tree.truncated,
           "modules": [[m.path, m.type, [[n, s] for n, s in m.params]] for m in tree.modules]}
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def fingerprint_id(module_tree_hash: str, optimizers: Iterable[str] | None) -> str:
    """The job's fingerprint from its model's tree hash and its optimizer class names (order and repeats
    ignored; none seen is its own value)."""
    doc = {"rule": RULE_VERSION, "tree": module_tree_hash, "optimizers": sorted(set(optimizers or ()))}
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()[:FINGERPRINT_LENGTH]


def precision_of(*, autocast_dtype: str | None, parameter_dtype: str | None) -> Precision | None:
    """The run's precision from autocast's dtype (when autocast was on) or the parameters' ("float32",
    "torch.bfloat16", "bf16" all read)."""
    if autocast_dtype is not None:
        s = _DTYPES.get(autocast_dtype.removeprefix("torch.").lower())
        return "amp_fp16" if s == "fp16" else "amp_bf16" if s == "bf16" else "other"
    if parameter_dtype is not None:
        return _DTYPES.get(parameter_dtype.removeprefix("torch.").lower(), "other")
    return None


_DTYPES: Final[dict[str, Precision]] = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32", "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16", "float64": "fp64", "double": "fp64", "fp64": "fp64"}
