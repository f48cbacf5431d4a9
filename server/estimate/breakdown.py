"""Estimated device memory at the peak, by what holds it (issue #17 item 5).

While the step is traced, every storage gets an origin: the baseline registers parameters and buffers (weights)
and the batch (inputs); a storage allocated inside a top-level module's forward is tagged with that module
(`StepOrigins` sets the recorder's tag from every module's forward hooks, so recomputed forwards under
activation checkpointing count too);
gradients and optimizer state are found by their storages when the optimizer step begins and when the step
ends. At the peak of live tensor bytes, a storage allocated in a module's forward and still live is an activation
kept for backward (the forward's other outputs are freed by then); anything else live that has no origin above
is a temporary or workspace. Rounding and cached-free come from the allocator simulation, the CUDA context and
cuBLAS workspace from the calibration table.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from fleetprof.report import BreakdownPart, MemoryBreakdown, ModuleActivations
from server.analysis.planning.allocator import AllocatorStats
from server.estimate.tracer import StorageRecorder, Trace

WEIGHTS, INPUTS, GRADIENTS, OPTIMIZER_STATE = "weights", "inputs", "gradients", "optimizer_state"
ACTIVATION = "activation:"  # + top-level module name
OUTSIDE_MODULES = "(model, outside its children)"
_SOURCE = "meta-device trace of the step, storages classified by origin at the peak of live tensor bytes"


class StepOrigins:
    """Tags storages with their origin while the step is traced; `origins` maps storage id -> origin."""

    def __init__(self, recorder: StorageRecorder, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.recorder = recorder
        self.model = model
        self.optimizer = optimizer
        self.origins: dict[int, str] = {}
        self._handles: list[Any] = []
        self._outer: list[str | None] = []  # the tags of the enclosing forwards

    def register_baseline(self, batch_tensors: list[torch.Tensor]) -> None:
        """After `recorder.register(...)`: parameters and buffers are weights, the batch is inputs."""
        for t in [*self.model.parameters(), *self.model.buffers()]:
            self._set(t, WEIGHTS)
        for t in batch_tensors:
            self._set(t, INPUTS)

    def mark(self, name: str) -> None:
        """The step's marks: gradients exist when the optimizer step begins, all optimizer state at the end."""
        if name.endswith("_optimizer"):
            for p in self.model.parameters():
                if p.grad is not None:
                    self._set(p.grad, GRADIENTS)
        if name.endswith("_optimizer") or name == "end":
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self._set(value, OPTIMIZER_STATE)

    def __enter__(self) -> StepOrigins:
        # every module's forward tags what it allocates with its top-level ancestor, so that the forwards that
        # activation checkpointing recomputes inside backward are tagged too; the model's own code between its
        # children (an HF model's loss) is OUTSIDE_MODULES
        top: dict[int, str] = {id(self.model): OUTSIDE_MODULES}
        for child_name, child in self.model.named_children():
            for module in child.modules():
                top.setdefault(id(module), child_name)
        for module in self.model.modules():
            name = top.get(id(module), OUTSIDE_MODULES)
            self._handles.append(module.register_forward_pre_hook(self._enter_module(name)))
            self._handles.append(module.register_forward_hook(self._leave_module))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._outer.clear()
        self.recorder.tag = None

    def _enter_module(self, name: str) -> Any:
        def hook(_module: torch.nn.Module, _args: Any) -> None:
            self._outer.append(self.recorder.tag)
            self.recorder.tag = ACTIVATION + name
        return hook

    def _leave_module(self, _module: torch.nn.Module, _args: Any, _out: Any) -> None:
        self.recorder.tag = self._outer.pop() if self._outer else None

    def _set(self, tensor: torch.Tensor, origin: str) -> None:
        sid = self.recorder.storage_id(tensor)
        if sid is not None and self.origins.get(sid) not in (WEIGHTS, INPUTS):
            self.origins[sid] = origin


def live_at_peak(trace: Trace) -> dict[int, int]:
    """Storage id -> bytes of the storages live at the (first) peak of live tensor bytes."""
    live = peak = 0
    peak_at = -1
    for i, (_, nbytes) in enumerate(trace.events):
        live += nbytes
        if live > peak:
            peak, peak_at = live, i
    alive: dict[int, int] = {}
    for sid, nbytes in trace.events[: peak_at + 1]:
        if nbytes > 0:
            alive[sid] = nbytes
        else:
            alive.pop(sid, None)
    return alive


def classify(trace: Trace, origins: dict[int, str]) -> Counter[str]:
    """Bytes live at the peak per origin (module activations as `activation:<name>`, rest 'temporaries')."""
    parts: Counter[str] = Counter()
    for sid, nbytes in live_at_peak(trace).items():
        origin = origins.get(sid) or trace.tags.get(sid) or "temporaries"
        parts[origin] += nbytes
    return parts


def _part(nbytes: int | None, source: str) -> BreakdownPart:
    return BreakdownPart(bytes=nbytes, source=source)


def estimate_breakdown(
    parts: Counter[str], stats: AllocatorStats, *, workspace_bytes: int = 0, context_bytes: int | None = None,
    context_source: str = "per GPU: see gpus[].breakdown",
) -> MemoryBreakdown:
    """The breakdown of one replay: `stats` of the allocator replay that included `workspace_bytes`."""
    modules = sorted(((k.removeprefix(ACTIVATION), v) for k, v in parts.items() if k.startswith(ACTIVATION)),
                     key=lambda kv: -kv[1])
    activations = sum(v for _, v in modules)
    temporaries = parts.get("temporaries", 0) + workspace_bytes
    rounding = stats.peak_allocated_bytes - stats.peak_requested_bytes  # the replay's requests include the workspace
    cached = stats.peak_reserved_bytes - stats.peak_allocated_bytes
    sim = "allocator simulation of the step (peak allocated - peak requested)"
    known = [parts.get(WEIGHTS, 0), parts.get(GRADIENTS, 0), parts.get(OPTIMIZER_STATE, 0), activations,
             parts.get(INPUTS, 0), temporaries, rounding, cached, context_bytes or 0]
    return MemoryBreakdown(
        at="peak of live tensor bytes in the traced step",
        weights=_part(parts.get(WEIGHTS, 0), _SOURCE),
        gradients=_part(parts.get(GRADIENTS, 0), _SOURCE),
        optimizer_state=_part(parts.get(OPTIMIZER_STATE, 0), _SOURCE),
        activations=_part(activations, _SOURCE + "; allocated in a top-level module's forward, still live"),
        activations_by_module=[ModuleActivations(module=m, bytes=v) for m, v in modules],
        inputs=_part(parts.get(INPUTS, 0), _SOURCE),
        temporaries_and_workspaces=_part(
            temporaries, _SOURCE + ("; + cuBLAS workspace (calibration)" if workspace_bytes else "")),
        persistent_unsplit=_part(0, "none: every storage of the step is classified"),
        allocator_rounding=_part(rounding, sim),
        cached_free=_part(cached, "allocator simulation (peak reserved - peak allocated)"),
        cuda_context=_part(context_bytes, context_source),
        total_bytes=sum(known),
    )
