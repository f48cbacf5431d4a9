"""Run the training step of a request under the recorder, per target device; the CPU twin for validation.

- `device: cuda`: on `meta` tensors, with `CudaStepEmulation` standing in for what CUDA dispatch would do
  (autocast's CUDA op lists, fused attention); the allocator simulation then adds the caching allocator.
- `device: cpu`: on fake CPU tensors (`FakeTensorMode`: meta storage, CPU dispatch keys), so the CPU dispatch
  decisions a real CPU loop makes are made here too, by PyTorch itself; see `emulation.CpuStep`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from server.estimate.breakdown import StepOrigins
from server.estimate.cudnn_rnn import cudnn_rnn_groups
from server.estimate.emulation import CpuStep, CudaStepEmulation, StepEmulation
from server.estimate.errors import EstimateError, InputMismatchError
from server.estimate.kernel_probe import KernelProbe
from server.estimate.meta_kernels import MetaKernels
from server.estimate.models import ResolvedModel, enable_checkpointing
from server.estimate.step import Batch, make_optimizer, train_steps
from server.estimate.tracer import StorageRecorder, Trace
from server.estimate.user_step import UserStep, run_user_steps

AUTOCAST_DTYPES = {"fp32": None, "amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}
TRACED_STEPS = 2  # the second step runs with optimizer state allocated: that is the steady state
MAX_TRACED_MICRO_BATCHES = 2  # accumulation repeats the second micro-batch's pattern exactly


@dataclass(frozen=True)
class StepSettings:
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    precision: str = "fp32"
    grad_accumulation: int = 1
    activation_checkpointing: bool = False
    user_step: UserStep | None = None  # the caller's own step (--local --step), in place of step.train_steps
    device: Literal["cuda", "cpu"] = "cuda"

    @property
    def traced_micro_batches(self) -> int:
        return min(self.grad_accumulation, MAX_TRACED_MICRO_BATCHES)


@dataclass
class StepTrace:
    trace: Trace
    marks: dict[str, tuple[int, int]]  # mark -> (event index, op index)
    parameter_count: int
    parameter_bytes: int
    origins: dict[int, str] = field(default_factory=dict)  # storage id -> origin (server.estimate.breakdown)


def prepare(resolved: ResolvedModel, settings: StepSettings, batch_size: int, device: torch.device,
            convert: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> tuple[
    torch.nn.Module, Batch, torch.optim.Optimizer, StepEmulation
]:
    model = resolved.build(device)
    if convert is not None:
        model = convert(model)
    if settings.activation_checkpointing:
        enable_checkpointing(model, resolved.hf)
    batch = resolved.make_batch(batch_size, device)
    if convert is not None:
        fake_mode = next(t for t in model.parameters()).fake_mode  # type: ignore[attr-defined]
        batch.args = [_fake_cpu(t, fake_mode) for t in batch.args]
        batch.kwargs = {k: _fake_cpu(t, fake_mode) for k, t in batch.kwargs.items()}
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(settings.optimizer, params, settings.optimizer_impl)
    dtype = AUTOCAST_DTYPES[settings.precision]
    emulation = CpuStep(dtype) if settings.device == "cpu" else CudaStepEmulation(dtype)
    return model, batch, optimizer, emulation


def baseline_tensors(model: torch.nn.Module, batch: Batch) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers(), *batch.tensors()]


def run_steps(model: torch.nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, emulation: StepEmulation,
              settings: StepSettings, mark: Callable[[str], None] = lambda _name: None) -> None:
    """The traced steps: the user's own step when the settings carry one, else the canned step."""
    if settings.user_step is not None:
        run_user_steps(settings.user_step, model, batch, emulation, steps=TRACED_STEPS, mark=mark)
    else:
        train_steps(model, batch, optimizer, emulation, steps=TRACED_STEPS,
                    micro_batches=settings.traced_micro_batches, mark=mark)


def trace_step(resolved: ResolvedModel, settings: StepSettings, batch_size: int,
               kernels: MetaKernels | None = None, *, labels: bool = False) -> StepTrace:
    """`kernels`: memoised meta kernels to share with other traces of the same model (server.estimate.meta_kernels;
    they answer meta tensors only, so a device-cpu trace on fake CPU tensors runs every kernel). `labels`: name
    each event by its aten op and module path (server.estimate.explain)."""
    fake: contextlib.AbstractContextManager = contextlib.nullcontext()
    if settings.device == "cpu":
        fake_mode = FakeTensorMode()
        fake = fake_mode
        model, batch, optimizer, emulation = prepare(
            resolved, settings, batch_size, torch.device("meta"), lambda m: _to_fake_cpu(m, fake_mode))
    else:
        model, batch, optimizer, emulation = prepare(resolved, settings, batch_size, torch.device("meta"))
    params = list(model.parameters())
    recorder = StorageRecorder(kernels=kernels, labels=labels)
    recorder.register(baseline_tensors(model, batch))
    origins = StepOrigins(recorder, model, optimizer)
    origins.register_baseline(batch.tensors())
    marks: dict[str, tuple[int, int]] = {}

    def mark(name: str) -> None:
        recorder.fused = None  # a step boundary ends any fused group's run
        marks[name] = (len(recorder.trace.events), len(recorder.trace.ops))
        origins.mark(name)

    try:
        # cpu: oneDNN's kernels measured; cuda: recurrent modules counted as cuDNN's fused calls
        probe = KernelProbe() if settings.device == "cpu" else cudnn_rnn_groups(recorder)
        with fake, recorder, origins, probe, _module_paths(model, recorder) if labels else contextlib.nullcontext():
            run_steps(model, batch, optimizer, emulation, settings, mark)
    except EstimateError:
        raise
    except Exception as exc:  # the model's own code raised: shapes, dtypes, an op meta cannot run
        raise InputMismatchError(
            f"the training step failed for batch size {batch_size}: {type(exc).__name__}: {str(exc)[:500]}"
        ) from exc
    finally:
        recorder.close()
    return StepTrace(
        recorder.trace, marks,
        parameter_count=sum(p.numel() for p in params),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        origins=origins.origins,
    )


def _fake_cpu(t: torch.Tensor, mode: FakeTensorMode) -> torch.Tensor:
    return FakeTensor(mode, t, torch.device("cpu"))


def _to_fake_cpu(model: torch.nn.Module, mode: FakeTensorMode) -> torch.nn.Module:
    """Meta parameters and buffers become fake CPU tensors over the same meta storage (tied weights stay tied).
    Built on meta, not under FakeTensorMode: initialisers that read values (`.item()`, ViT's trunc_normal_) have
    none to read on meta and never run on fake tensors."""
    seen: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in seen:
                    seen[id(p)] = torch.nn.Parameter(_fake_cpu(p.data, mode), requires_grad=p.requires_grad)
                module._parameters[name] = seen[id(p)]  # type: ignore[assignment]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in seen:
                    seen[id(b)] = _fake_cpu(b, mode)
                module._buffers[name] = seen[id(b)]
    return model


@contextlib.contextmanager
def _module_paths(model: torch.nn.Module, recorder: StorageRecorder) -> Iterator[None]:
    """Prefix the recorder's op labels with the path of the module running (forward only: backward has none)."""
    names = {id(m): name or "model" for name, m in model.named_modules()}
    stack: list[str] = []

    def pre(module: torch.nn.Module, _args: object) -> None:
        stack.append(names.get(id(module), type(module).__name__))
        recorder.module_path = stack[-1]

    def post(_module: torch.nn.Module, _args: object, _out: object) -> None:
        if stack:
            stack.pop()
        recorder.module_path = stack[-1] if stack else ""

    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
