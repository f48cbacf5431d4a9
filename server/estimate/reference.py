"""The independent reference: a plain training loop, as users write it, measured by `torch.profiler` on CPU.

None of the estimator's code runs here (no step.py, no emulation, no tracer): the model and its batch come from
the request's `ResolvedModel` (the model *is* the thing estimated), the loop is

    opt.zero_grad(); with torch.autocast("cpu", dtype, enabled=amp): loss = f(model(x)); loss.backward(); opt.step()

with the optimizer built as users build it (`torch.optim.AdamW(model.parameters(), lr=...)`: PyTorch picks its
implementation per device, the for-loop one on CPU).

What is measured, and from which baseline:
- The profiler starts after the model, the optimizer and the batch exist (what a job holds before its loop:
  parameters, buffers, inputs); those storages are counted once, as the baseline, and none of them is freed.
- Two steps run under the profiler: a warm one (gradients and optimizer state appear) and the measured one,
  which starts with `zero_grad()` freeing the warm step's gradients. Starting the profiler *between* the steps
  would be wrong: the profiler reports no free of a block allocated before it started ("Memory block of unknown
  size ..."), so the gradients freed by `zero_grad()` would count as live for the whole step.
- Peak = baseline + max of the running sum of the profiler's CPU `[memory]` events during the measured step.
  The CPU allocator neither caches nor rounds: this is the sum of live tensor sizes, comparable with the
  estimator's `peak_requested_bytes` for `device: cpu`.
- The second, independent check (`end_check_bytes`): after the step, baseline + the sum of all events must
  equal the bytes of the storages a training job holds between steps, counted by walking them (parameters,
  buffers, gradients, optimizer state, inputs). A mismatch means the profiler missed or invented an allocation
  (or a storage outside the model is alive); `ReferencePeak.consistent` reports it. PyTorch has no CPU
  allocator statistics to cross-check the peak itself (`torch.cpu` exposes none in 2.13; `tracemalloc` cannot
  see ATen's allocator), so the profiler is the one instrument for the peak.
Allocations oneDNN makes with its own allocator (scratchpads) reach neither the profiler nor the estimator.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from server.estimate.models import ResolvedModel

_AMP = {"fp32": None, "amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}
_MEASURED = "reference/measured_step"


@dataclass(frozen=True)
class ReferencePeak:
    peak_bytes: int  # baseline + running-sum peak of the measured step
    baseline_bytes: int  # parameters, buffers, inputs: alive before the loop
    end_bytes: int  # baseline + every event's size: what the profiler says is alive after the step
    end_check_bytes: int  # the same, counted by walking parameters, grads, optimizer state, buffers, inputs
    events: tuple[tuple[int, int, str], ...]  # (start ns, +/- bytes, enclosing aten op) of the measured step

    @property
    def consistent(self) -> bool:
        return self.end_bytes == self.end_check_bytes


def make_user_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """As a user writes it: no `foreach=` argument, PyTorch's per-device default."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-3)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}")


def user_loss(output: Any, targets: torch.Tensor | None) -> torch.Tensor:
    """What a training script does with the output: HF's `.loss`, else cross-entropy against labels, else mean."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if hasattr(output, "last_hidden_state"):
        output = output.last_hidden_state
    elif isinstance(output, (tuple, list)):
        output = output[0]
    if targets is not None and output.dim() == 2:
        return F.cross_entropy(output, targets)
    return output.float().mean()


def _storages_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _held_between_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, inputs: list[torch.Tensor]) -> int:
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return _storages_bytes([*model.parameters(), *model.buffers(), *grads, *state, *inputs])


def measure_reference_peak(resolved: ResolvedModel, optimizer: str, precision: str, batch_size: int,
                           seed: int = 0) -> ReferencePeak:
    """Peak bytes of the second of two plain CPU training steps (see the module docstring)."""
    torch.manual_seed(seed)
    cpu = torch.device("cpu")
    model = resolved.build(cpu)
    batch = resolved.make_batch(batch_size, cpu)
    model.train()
    # the labels a data loader would hand over with the batch (drawn once the output's width is known)
    targets: list[torch.Tensor | None] = [None]
    opt = make_user_optimizer(optimizer, model)
    amp = _AMP[precision]

    def train_step() -> None:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            out = model(*batch.args, **batch.kwargs)
            if batch.class_targets and targets[0] is None and isinstance(out, torch.Tensor) and out.dim() == 2:
                targets[0] = torch.randint(0, out.shape[1], (out.shape[0],))
            loss = user_loss(out, targets[0] if batch.class_targets else None)
            del out
        loss.backward()
        opt.step()

    inputs = batch.tensors()
    baseline = _storages_bytes([*model.parameters(), *model.buffers(), *inputs])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step()  # warm: gradients and optimizer state appear
        with record_function(_MEASURED):
            train_step()
    end_check = _held_between_steps(model, opt, [*inputs, *([targets[0]] if targets[0] is not None else [])])
    return _peak_from_profile(prof, baseline, end_check)


def _peak_from_profile(prof: profile, baseline: int, end_check: int) -> ReferencePeak:
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    raw = list(prof.profiler.kineto_results.events())
    window = next(((e.start_ns(), e.end_ns()) for e in raw if e.name() == _MEASURED), None)
    if window is None:  # pragma: no cover - the profiler always records a record_function range
        raise RuntimeError("the measured step's range is missing from the profile")
    ops = sorted(((e.start_ns(), e.end_ns(), e.name()) for e in raw
                  if e.name().startswith("aten::") and window[0] <= e.start_ns() <= window[1]), key=lambda o: o[0])
    # `nbytes` is in the C++ binding, missing from its stub
    mem = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(raw)  # type: ignore[attr-defined]
                 if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = total = 0
    peak = None
    events: list[tuple[int, int, str]] = []
    for start, _, nbytes in mem:
        live += nbytes
        total += nbytes
        if window[0] <= start <= window[1]:
            peak = live if peak is None else max(peak, live)
            events.append((start, nbytes, _innermost_op(ops, start)))
    assert peak is not None
    return ReferencePeak(baseline + peak, baseline, baseline + total, end_check, tuple(events))


# allocation helpers every kernel calls: naming them says nothing about which op allocated
_ALLOCATORS = frozenset({"aten::empty", "aten::empty_strided", "aten::resize_", "aten::empty_like", "aten::zeros",
                         "aten::zeros_like", "aten::new_empty", "aten::new_empty_strided", "aten::new_zeros",
                         "aten::zero_", "aten::fill_", "aten::to", "aten::_to_copy", "aten::contiguous",
                         "aten::clone", "aten::copy_"})


def _innermost_op(ops: list[tuple[int, int, str]], t: int) -> str:
    """The latest-starting aten op whose range contains t, past allocation helpers (the allocation's cause)."""
    i = bisect.bisect_right(ops, (t, 1 << 62, ""))
    helper = ""
    for start, end, name in reversed(ops[max(0, i - 256):i]):
        if start <= t <= end:
            if name not in _ALLOCATORS:
                return name
            helper = helper or name
    return helper
