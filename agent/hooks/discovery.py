"""Which module is the model: during the first step, global forward hooks watch the top-level modules called;
the one with the most parameters wins, and only it keeps a (per-module) hook afterwards."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

CALLS_WITHOUT_BOUNDARY = 3  # a loop that never ends a step: stop paying for global hooks


class ModelDiscovery:
    def __init__(self, mm: Any, *, on_top_level_forward: Callable[[Any], None], on_model: Callable[[Any], None],
                 on_error: Callable[[BaseException], None]):
        self._mm = mm  # torch.nn.modules.module: the global hook registry
        self._on_top_level_forward = on_top_level_forward
        self._on_model = on_model
        self._on_error = on_error
        self.active = False
        self.handles: list[Any] = []
        self._depth = 0
        self._candidates: dict[int, tuple[weakref.ref[Any], int]] = {}

    def start(self) -> None:
        self.active = True
        self.handles.append(self._mm.register_module_forward_pre_hook(self._pre))
        self.handles.append(self._mm.register_module_forward_hook(self._post, always_call=True))

    def new_step(self) -> None:
        self._depth = 0

    def _pre(self, module: Any, args: Any) -> None:
        try:
            if not self.active:
                return
            if self._depth == 0:
                self._on_top_level_forward(args)
                key = id(module)
                ref, calls = self._candidates.get(key, (weakref.ref(module), 0))
                self._candidates[key] = (ref, calls + 1)
                if calls + 1 >= CALLS_WITHOUT_BOUNDARY:
                    self.finish()
                    return
            self._depth += 1
        except Exception as exc:
            self._on_error(exc)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self.active and self._depth > 0:
            self._depth -= 1

    def remove_hooks(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def finish(self) -> None:
        """Stop watching; hand the module with the most parameters (if any is still alive) to `on_model`."""
        self.active = False
        self.remove_hooks()
        best, best_params = None, -1
        for ref, _calls in self._candidates.values():
            mod = ref()
            if mod is None:
                continue
            n = sum(p.numel() for p in mod.parameters())
            if n > best_params:
                best, best_params = mod, n
        self._candidates.clear()
        if best is not None:
            self._on_model(best)
