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

Other frameworks build the same `ModuleTree` (the hash and the id are the same functions):
- Keras 3 (`describe_keras_model`, any backend): per layer, its path from the model by position (`0`, `2.1`: Keras
  names such as `dense_3` count the layers a process made before, so they are no part of the model), its type's
  qualname (the model's own: `Sequential`, `Functional`, a subclass), and the weights it created as trainable
  (`kernel`, `bias`, `gamma`...) with their shapes. `InputLayer`s are left out (no weights; a Sequential with or
  without `keras.Input` is one model), and so are non-trainable weights (BatchNormalization's moving statistics:
  PyTorch's buffers). Freezing a layer keeps its weights in the tree (Keras keeps them in the layer's trainable list
  too). The layer classes and weight shapes are the same on every backend (torch, JAX, TensorFlow): one model has
  one id whichever backend ran it; a Keras model and a PyTorch module of the same architecture do not share one
  (other types, other weight names and layouts).
- a JAX parameter pytree (`describe_pytree`, from the leaves' key paths and shapes): one node per container, the
  root's path "", a child's its dotted keys (`params.Dense_0`), every node of type `pytree` (containers are how a
  program stores arrays, dict or flax FrozenDict or a struct; the keys, flax's `Dense_0` or haiku's
  `mlp/~/linear`, carry the architecture), its params the array leaves directly inside it, in flatten order.

Format: 20 lowercase hex characters (80 bits of sha256), `FINGERPRINT_PATTERN`. `RULE_VERSION` is hashed in: a
change of rule gives new ids, never a silent collision with the old ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
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


def _walk(root: Any, *, type_of: Callable[[Any], str], own_params: Callable[[Any], Iterable[tuple[str, Any]]],
          children: Callable[[Any], Iterable[tuple[str, Any]]]) -> ModuleTree:
    """Depth first in registration order from `root`: each node's type and own parameters' shapes, paths joined
    with '.', at most MAX_MODULES nodes; a parameter met twice (shared weights) counts once."""
    nodes: list[ModuleNode] = []
    seen_params: set[int] = set()
    count = 0
    stack: list[tuple[str, Any]] = [("", root)]
    truncated = False
    while stack:
        if len(nodes) >= MAX_MODULES:
            truncated = True
            break
        path, node = stack.pop()
        params = []
        for name, p in own_params(node):
            shape = _shape(p)
            params.append((name, shape))
            if id(p) not in seen_params:
                seen_params.add(id(p))
                n = 1
                for d in shape:
                    n *= d
                count += n
        nodes.append(ModuleNode(path=path, type=type_of(node), params=params))
        stack.extend(reversed([(f"{path}.{name}" if path else name, child) for name, child in children(node)]))
    return ModuleTree(root_type=type_of(root), modules=nodes, parameter_count=count, truncated=truncated)


def describe_module(module: Any) -> ModuleTree:
    """The `ModuleTree` of a PyTorch-like module (see the module docstring); wrappers unwrapped."""
    return _walk(unwrap(module), type_of=type_name, own_params=lambda m: m.named_parameters(recurse=False),
                 children=lambda m: m.named_children())


def describe_keras_model(model: Any) -> ModuleTree:
    """The `ModuleTree` of a built Keras 3 model or layer (see the module docstring); duck-typed (`_layers`,
    `_trainable_variables`), this package imports no keras. Layers are named by position: Keras' automatic names
    change from run to run."""
    seen: set[int] = {id(model)}

    def children(layer: Any) -> list[tuple[str, Any]]:
        out = []
        for child in getattr(layer, "_layers", None) or ():
            if id(child) in seen or type(child).__name__ == "InputLayer":
                continue  # a layer used twice (shared weights) is described where it was first met
            seen.add(id(child))
            out.append(child)
        return [(str(i), c) for i, c in enumerate(out)]

    return _walk(model, type_of=lambda layer: type(layer).__qualname__, children=children,
                 own_params=lambda layer: [(str(getattr(v, "name", "")), v) for v in _own_keras_weights(layer)])


def _own_keras_weights(layer: Any) -> list[Any]:
    """The weights a Keras layer created as trainable, not its sublayers'. `_trainable_variables` (Keras 3.0 on)
    keeps them whatever `layer.trainable` says; a layer without it: its trainable weights when it has no
    sublayers (they would be counted twice), else none."""
    own = getattr(layer, "_trainable_variables", None)
    if own is not None:
        return list(own)
    if getattr(layer, "_layers", None):
        return []
    return list(getattr(layer, "trainable_weights", None) or ())


def describe_pytree(leaves: Iterable[tuple[tuple[str, ...], Any]], *, root_type: str = "pytree") -> ModuleTree:
    """The `ModuleTree` of a parameter pytree from its leaves in flatten order: (key path as strings, array).
    Every leaf must have a `shape` (raise ValueError otherwise: not a tree of arrays)."""
    nodes: dict[tuple[str, ...], list[tuple[str, list[int]]]] = {(): []}
    count = 0
    for keys, leaf in leaves:
        if getattr(leaf, "shape", None) is None:
            raise ValueError(f"leaf {'.'.join(keys) or '<root>'} is a {type(leaf).__name__}, not an array")
        if len(nodes) >= MAX_MODULES:
            return ModuleTree(root_type=root_type, modules=_pytree_nodes(nodes), parameter_count=count,
                              truncated=True)
        parent = tuple(keys[:-1])
        for i in range(1, len(parent) + 1):
            nodes.setdefault(parent[:i], [])
        shape = _shape(leaf)
        nodes[parent].append((keys[-1] if keys else "", shape))
        n = 1
        for d in shape:
            n *= d
        count += n
    if count == 0 and not any(nodes.values()):
        raise ValueError("no array leaves")
    return ModuleTree(root_type=root_type, modules=_pytree_nodes(nodes), parameter_count=count)


def _pytree_nodes(nodes: dict[tuple[str, ...], list[tuple[str, list[int]]]]) -> list[ModuleNode]:
    return [ModuleNode(path=".".join(k), type="pytree", params=v) for k, v in nodes.items()]


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
