"""Record every storage a training step allocates, in order, with its size and lifetime.

A `TorchDispatchMode` sees each aten op below autograd; every output storage not seen before is a new
allocation. A weakref on the untyped storage (PyTorch keeps one Python object per live StorageImpl) fires
when the storage dies, which is exactly when the CUDA caching allocator would get the block back. Storages
that exist before the step (parameters, buffers, inputs) are registered first, as the baseline.

Allocations made *inside* a kernel (cuDNN/cuBLAS workspaces) are invisible here; the cuBLAS workspace is
added from the calibration table, see `calibration.py`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from server.estimate.meta_kernels import MetaKernels
from server.estimate.roofline import OpCost

_aten = torch.ops.aten
_META_SCALARS: dict[torch.dtype, Any] = {torch.bool: True, torch.float32: 1.0, torch.float16: 1.0, torch.bfloat16: 1.0}
_NO_COST = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.detach.default, _aten.lift_fresh.default}


@dataclass
class Trace:
    """`events[i] = (storage_id, nbytes)`: nbytes > 0 allocates, < 0 frees. Baseline allocations come first."""

    events: list[tuple[int, int]] = field(default_factory=list)
    baseline_events: int = 0
    labels: list[str] | None = None  # with `StorageRecorder(labels=True)`: the aten op of each event
    ops: list[OpCost] = field(default_factory=list)
    tags: dict[int, str] = field(default_factory=dict)  # storage id -> what allocated it (the recorder's `tag`)

    @property
    def allocations(self) -> int:
        return sum(1 for _, n in self.events if n > 0)

    def peak_requested_bytes(self) -> int:
        """Max over time of the sum of live storage sizes (what a non-caching allocator would peak at)."""
        live = peak = 0
        for _, nbytes in self.events:
            live += nbytes
            peak = max(peak, live)
        return peak


class FusedGroup:
    """Ops that one fused library call runs (cuDNN's RNN, server.estimate.cudnn_rnn), counted as `calls` OpCosts
    that share their FLOPs and bytes: placed where the group's first op was, rewritten as ops join."""

    def __init__(self, calls: int) -> None:
        self.calls = max(calls, 1)
        self.start: int | None = None
        self.flops = self.bytes = 0.0
        self.kind = "other"
        self.lowp = False

    def add(self, cost: OpCost, ops: list[OpCost]) -> None:
        if self.start is None:
            self.start = len(ops)
            ops.extend([cost] * self.calls)
        self.flops += cost.flops
        self.bytes += cost.bytes
        if cost.kind != "other" and self.kind == "other":
            self.kind, self.lowp = cost.kind, cost.lowp
        share = OpCost(self.flops / self.calls, self.bytes / self.calls, self.kind, self.lowp)
        ops[self.start:self.start + self.calls] = [share] * self.calls


class StorageRecorder(TorchDispatchMode):
    """Appends to `trace` while active; `close()` stops recording frees that happen after the step."""

    def __init__(self, trace: Trace | None = None, count_ops: bool = True, kernels: MetaKernels | None = None,
                 labels: bool = False) -> None:
        super().__init__()
        self.trace = trace or Trace()
        if labels:
            self.trace.labels = []
        self._op = "baseline"
        self.module_path = ""  # set by the caller while a module's forward runs (labels only)
        self.count_ops = count_ops
        self.kernels = kernels or MetaKernels()  # memoised meta kernels; pass one to share it across traces
        self._live: dict[int, tuple[int, int]] = {}  # id(storage) -> (storage id, nbytes)
        self._refs: dict[int, weakref.ref] = {}
        self._next_id = 0
        self._open = True
        self.tag: str | None = None  # set by the caller (a module's forward); new storages carry it
        self.fused: FusedGroup | None = None  # set by the caller: op costs go to this group (server.estimate.cudnn_rnn)

    def storage_id(self, tensor: torch.Tensor) -> int | None:
        """The id under which `tensor`'s storage appears in the trace; None if it is not live in it."""
        known = self._live.get(id(tensor.untyped_storage()))
        return None if known is None else known[0]

    def register(self, tensors: Iterable[torch.Tensor]) -> None:
        """Storages that exist before the step: parameters, buffers, inputs (deduplicated, tied weights once)."""
        for t in tensors:
            self._track(t.untyped_storage())
        self.trace.baseline_events = len(self.trace.events)

    def close(self) -> None:
        self._open = False

    def _track(self, storage: torch.UntypedStorage) -> bool:
        key = id(storage)
        nbytes = storage.nbytes()
        known = self._live.get(key)
        if known is not None:
            if known[1] == nbytes:
                return False
            # resize_ / set_ changed the size in place: the allocator frees and allocates
            self._release(key, known[0], known[1])
        if nbytes == 0:
            return False
        sid = self._next_id
        self._next_id += 1
        self._live[key] = (sid, nbytes)
        self.trace.events.append((sid, nbytes))
        if self.tag is not None:
            self.trace.tags[sid] = self.tag
        if self.trace.labels is not None:
            self.trace.labels.append(self._op)
        self._refs[sid] = weakref.ref(storage, lambda _r: self._on_free(key, sid, nbytes))
        return True

    def _on_free(self, key: int, sid: int, nbytes: int) -> None:
        self._refs.pop(sid, None)
        if self._live.get(key, (None,))[0] == sid:
            self._release(key, sid, nbytes)

    def _release(self, key: int, sid: int, nbytes: int) -> None:
        del self._live[key]
        if self._open:
            self.trace.events.append((sid, -nbytes))
            if self.trace.labels is not None:
                self.trace.labels.append(self._op)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.trace.labels is not None:
            self._op = f"{self.module_path}/{func.name()}" if self.module_path else func.name()
        if func is _aten._local_scalar_dense.default and (
            args[0].device.type == "meta" or isinstance(args[0], FakeTensor)
        ):
            # a data-dependent branch (`.item()`, `if t.all():`) has no value on meta. Models use these to
            # detect the unusual case (padding present, packed sequences), so read True / 1: the plain case.
            return _META_SCALARS.get(args[0].dtype, 1)
        key = self.kernels.key(func, args, kwargs)
        out = self.kernels.run(func, args, kwargs, key)
        new = False
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                new |= self._track(t.untyped_storage())
        if self.count_ops and func not in _NO_COST and (new or func._schema.is_mutable):
            cost = self.kernels.cost(func, args, kwargs, out, key)
            if cost is not None:
                if self.fused is not None:
                    self.fused.add(cost, self.trace.ops)
                else:
                    self.trace.ops.append(cost)
        return out
