"""Per-module forward/backward time and activation memory, for one sampled step at a time.

Global module forward hooks are registered only for a sampled step and removed at its end, so the other
steps run PyTorch's hook-free fast path.

Backward time does NOT use `register_module_full_backward_hook`: full backward hooks wrap every module's
outputs in a `BackwardHookFunction` view, and a following in-place op (`nn.ReLU(inplace=True)`, as in every
ResNet) then fails with "Output 0 of BackwardHookFunction is a view and is being modified inplace". Instead,
from the forward hook, a module's backward is bracketed by autograd-graph hooks that change nothing:
  start = the pre-hook of its output's `grad_fn` (the gradient w.r.t. its output is ready);
  end   = the latest of: the gradient w.r.t. one of its inputs being ready, and a parameter of its subtree
          having its gradient accumulated.
Activation memory: on CUDA the allocated-bytes delta around the forward (children included); on CPU the
bytes of the tensors the module returns.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agent.hooks.device_time import cuda_event_recorder
from agent.hooks.memory import cuda_allocated_reader

Stamp = Any  # float (perf_counter seconds) or a recorded torch.cuda.Event


@dataclass
class ModuleStats:
    name: str
    module_type: str
    calls: int = 0
    forward_s: float = 0.0
    activation_bytes: int = 0
    fwd_pending: list[tuple[Stamp, Stamp]] = field(default_factory=list)
    bw_start: list[Stamp] = field(default_factory=list)
    bw_end: list[Stamp] = field(default_factory=list)


def iter_tensors(obj: Any, torch: Any, depth: int = 0) -> Iterator[Any]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (tuple, list)):
        for item in obj:
            yield from iter_tensors(item, torch, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item, torch, depth + 1)


class LayerSampler:
    """Measures every module called during one step; `finish()` returns LayerEvent field dicts."""

    def __init__(self, torch: Any, *, on_error: Callable[[BaseException], None]):
        self._torch = torch
        self._on_error = on_error
        self._handles: list[Any] = []
        self._stats: dict[int, ModuleStats] = {}
        self._open: dict[int, list[tuple[Stamp, int]]] = {}
        self._names: dict[int, str] = {}
        self._used_names: set[str] = set()
        self._cuda = False
        # memory.cuda_allocated_reader and device_time.cuda_event_recorder, made on the first CUDA sampled step
        self._allocated: Any = None
        self._record_event: Any = None
        self.active = False

    # ------------------------------------------------------------------ clock

    def _now(self) -> Stamp:
        if self._cuda:
            return self._record_event()
        return time.perf_counter()

    def _elapsed_s(self, a: Stamp, b: Stamp) -> float:
        if isinstance(a, float):
            return b - a
        return a.elapsed_time(b) / 1000.0  # ms

    # ------------------------------------------------------------------ lifecycle

    def start(self, model: Any | None, *, cuda: bool, names: dict[int, str] | None = None) -> None:
        """`names`: module names by id, given by a caller whose model does not name its modules the torch way
        (Keras layers on the torch backend: named after their Keras names); no parameter hooks then."""
        from torch.nn.modules import module as mm

        self._cuda = cuda
        if cuda and self._allocated is None:
            self._allocated = cuda_allocated_reader(self._torch)
            self._record_event = cuda_event_recorder(self._torch)
        self._stats.clear()
        self._open.clear()
        self._names.clear()
        self._used_names.clear()
        if names is not None:
            self._names.update(names)
            self._used_names.update(names.values())
        elif model is not None:
            named = list(model.named_modules())
            for name, mod in named:
                self._names[id(mod)] = name or type(mod).__name__
                self._used_names.add(self._names[id(mod)])
            self._hook_params(named)
        self._handles.append(mm.register_module_forward_pre_hook(self._pre))
        self._handles.append(mm.register_module_forward_hook(self._post))
        self.active = True

    def _hook_params(self, named: list[tuple[str, Any]]) -> None:
        """Each parameter's gradient accumulation marks a backward end for its module and all ancestors."""
        ids_by_name = {name: id(mod) for name, mod in named}
        for name, mod in named:
            ancestors = [ids_by_name[""]]
            parts = name.split(".") if name else []
            for i in range(1, len(parts) + 1):
                ancestors.append(ids_by_name.get(".".join(parts[:i]), ids_by_name[""]))
            for p in mod.parameters(recurse=False):
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._make_end(ancestors)))

    def stop(self) -> None:
        for h in self._handles:
            with contextlib.suppress(Exception):  # a handle whose graph is gone
                h.remove()
        self._handles.clear()
        self.active = False

    def finish(self) -> list[dict[str, Any]]:
        """Stop and turn what was measured into LayerEvent fields (without job_id/ts/step)."""
        self.stop()
        if self._cuda:
            self._torch.cuda.synchronize()  # once per sampled step, to read the events
        out = []
        for st in self._stats.values():
            forward_s = st.forward_s + sum(self._elapsed_s(a, b) for a, b in st.fwd_pending)
            backward_s = None
            if st.bw_start and st.bw_end:
                start = st.bw_start[0]
                backward_s = max(0.0, max(self._elapsed_s(start, e) for e in st.bw_end))
            out.append({"module": st.name[:500], "module_type": st.module_type[:200], "calls": st.calls,
                        "forward_s": max(0.0, forward_s), "backward_s": backward_s,
                        "activation_bytes": max(0, st.activation_bytes)})
        self._stats.clear()
        return out

    # ------------------------------------------------------------------ hooks

    def _name_of(self, module: Any) -> str:
        name = self._names.get(id(module))
        if name is None:
            base = type(module).__name__
            name, n = base, 1
            while name in self._used_names:
                n += 1
                name = f"{base}#{n}"
            self._names[id(module)] = name
            self._used_names.add(name)
        return name

    def _pre(self, module: Any, args: Any) -> None:
        try:
            mem = self._allocated() if self._cuda else 0
            self._open.setdefault(id(module), []).append((self._now(), mem))
        except Exception as exc:
            self._on_error(exc)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        try:
            stack = self._open.get(id(module))
            if not stack:
                return
            t0, mem0 = stack.pop()
            t1 = self._now()
            key = id(module)
            st = self._stats.get(key)
            if st is None:
                st = self._stats[key] = ModuleStats(self._name_of(module), type(module).__name__)
            st.calls += 1
            if isinstance(t0, float):
                st.forward_s += t1 - t0
            else:
                st.fwd_pending.append((t0, t1))
            torch = self._torch
            outs = list(iter_tensors(output, torch))
            if self._cuda:
                st.activation_bytes += self._allocated() - mem0
            else:
                st.activation_bytes += sum(t.numel() * t.element_size() for t in outs)
            if not torch.is_grad_enabled():
                return
            out_fn = next((t.grad_fn for t in outs if t.grad_fn is not None), None)
            if out_fn is None:
                return
            self._handles.append(out_fn.register_prehook(self._make_start(st)))
            end = self._make_end_stats(st)
            for t in iter_tensors(args, torch):
                if not t.requires_grad:
                    continue
                if t.grad_fn is not None:
                    self._handles.append(t.grad_fn.register_prehook(end))
                else:
                    self._handles.append(t.register_hook(end))
                break
        except Exception as exc:
            self._on_error(exc)

    def _make_start(self, st: ModuleStats) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            try:
                if not st.bw_start:
                    st.bw_start.append(self._now())
            except Exception as exc:
                self._on_error(exc)
        return hook

    def _make_end_stats(self, st: ModuleStats) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            try:
                st.bw_end.append(self._now())
            except Exception as exc:
                self._on_error(exc)
        return hook

    def _make_end(self, module_ids: list[int]) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            try:
                t = self._now()
                for mid in module_ids:
                    st = self._stats.get(mid)
                    if st is not None:
                        st.bw_end.append(t)
            except Exception as exc:
                self._on_error(exc)
        return hook
