"""Memoised meta kernels and op costs for the tracer: the same op on the same shapes gives the same output shapes.

A transformer repeats each layer's ops with identical shapes (32 times in a 7 B Llama, twice per traced step, once
more per traced batch size), and on `meta` most of a trace's time is PyTorch's Python meta kernels (torch._refs,
torch._prims) computing output shapes. Keyed by the op and every argument's metadata (shape, stride, dtype,
storage offset of tensors; the value of everything else), a repeat is answered with fresh `empty_strided` meta
tensors of the recorded shapes, and its roofline cost (server.estimate.roofline.op_cost, a function of the same
metadata) from the first computation.

Only what cannot differ is reused: ops whose schema is mutable or whose outputs alias an input are always run (a
view must share its input's storage, an in-place op must return its input), and an op is memoised only after its
first run showed outputs that are all meta tensors, each with a storage of its own exactly its size, none shared
with an input (the properties a fresh `empty_strided` has). bench/estimate_speed.py measures the effect; the
tests check traces with and without it are equal event for event.
"""

from __future__ import annotations

from typing import Any

import torch

from server.estimate.roofline import OpCost, op_cost

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
_SCALAR_TYPES = frozenset(_SCALARS)
_UNCACHEABLE: Any = object()


class _NoKey(Exception):
    """An argument whose metadata does not determine the result (a non-meta tensor, an object)."""


def _key(value: Any, float_values: bool = True) -> Any:
    """`float_values=False` for in-place ops, whose outputs are their inputs: a float there is a coefficient
    (Adam's step size changes every step) and cannot change a shape, unlike `arange(0.0, 10.5)`'s."""
    kind = type(value)
    if kind is torch.Tensor or isinstance(value, torch.Tensor):
        if not value.is_meta:
            raise _NoKey
        return (value.shape, value.stride(), value.dtype, value.storage_offset())
    if kind is float and not float_values:
        return float
    if kind is list or kind is tuple:
        return (kind, tuple([_key(v, float_values) for v in value]))
    if kind in _SCALAR_TYPES or isinstance(value, _SCALARS):
        return (kind, value)  # the type too: 1 == 1.0 == True, but they are different arguments
    raise _NoKey


def _storages(args: tuple) -> list[int]:
    """The StorageImpl behind every tensor argument (set_ swaps it without changing any shape)."""
    tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, torch.Tensor)]
    return [t.untyped_storage()._cdata for t in tensors]


def _storage_span_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))) * t.element_size()


def _fresh_outputs(out: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The output tensors when they look like fresh allocations (see the module docstring), else None."""
    leaves = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" and t.storage_offset() == 0 for t in leaves):
        return None
    storages = [id(t.untyped_storage()) for t in leaves]
    if len(set(storages)) != len(storages) or {id(t.untyped_storage()) for t in inputs}.intersection(storages):
        return None
    if any(t.untyped_storage().nbytes() != _storage_span_bytes(t) for t in leaves):
        return None
    return leaves


class MetaKernels:
    """One per estimate (shared by the traces of its batch sizes); `hits` / `misses` count memoised kernel calls."""

    def __init__(self) -> None:
        self._outputs: dict[Any, Any] = {}
        self._costs: dict[Any, OpCost | None] = {}
        self.hits = 0
        self.misses = 0

    def key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The memo key of a call, or None when an argument's metadata does not determine the result."""
        floats = not func._schema.is_mutable
        try:
            return (func, _key(args, floats), _key(tuple(kwargs.items()), floats))
        except _NoKey:
            return None

    def run(self, func: Any, args: tuple, kwargs: dict, key: Any) -> Any:
        """`func(*args, **kwargs)`, or fresh meta tensors of the shapes it returned before for the same key, or
        (an in-place op seen to leave every argument's metadata as it was) its input again without running it."""
        if key is None:
            return func(*args, **kwargs)
        known = self._outputs.get(key)
        if known is _UNCACHEABLE:
            return func(*args, **kwargs)
        if known is not None:
            self.hits += 1
            kind, what = known
            if kind == "in_place":
                return None if what is None else args[what]
            container, metas = what
            fresh = [torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in metas]
            return fresh[0] if container is None else container(fresh)
        self.misses += 1
        schema = func._schema
        if schema.is_mutable:
            storages = _storages(args)
            out = func(*args, **kwargs)
            self._outputs[key] = self._in_place(func, args, kwargs, key, out, storages)
            return out
        if any(r.alias_info is not None for r in schema.returns):
            self._outputs[key] = _UNCACHEABLE  # a view shares its input's storage: always run
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        inputs += [t for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple))
                   for t in a if isinstance(t, torch.Tensor)]
        leaves = _fresh_outputs(out, inputs)
        if leaves is None:
            self._outputs[key] = _UNCACHEABLE
        else:
            container = None if isinstance(out, torch.Tensor) else type(out)
            self._outputs[key] = ("fresh", (container, [(tuple(t.shape), t.stride(), t.dtype) for t in leaves]))
        return out

    def _in_place(self, func: Any, args: tuple, kwargs: dict, key: Any, out: Any, storages: list[int]) -> Any:
        """How to answer this in-place call again without running it: its meta kernel only checks shapes, so
        when the call left every argument's metadata (shape, stride, offset, storage size) as it found it and
        returned nothing or one of its own arguments, a repeat on the same metadata does the same. Ops that
        change metadata in place (resize_, set_, transpose_, ...) fail the check and always run."""
        if self.key(func, args, kwargs) != key or _storages(args) != storages or any(
            isinstance(a, torch.Tensor) and a.untyped_storage().nbytes() < _storage_span_bytes(a) for a in args
        ):
            return _UNCACHEABLE
        if out is None:
            return ("in_place", None)
        position = next((i for i, a in enumerate(args) if a is out), None)
        return _UNCACHEABLE if position is None else ("in_place", position)

    def cost(self, func: Any, args: tuple, kwargs: dict, out: Any, key: Any) -> OpCost | None:
        """`op_cost(...)`, computed once per key."""
        if key is None:
            return op_cost(func, args, kwargs, out)
        if key not in self._costs:
            self._costs[key] = op_cost(func, args, kwargs, out)
        return self._costs[key]
