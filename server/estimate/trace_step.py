"""Run the training step of a request on `meta` under the recorder; the CPU twin for validation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from server.estimate.breakdown import StepOrigins
from server.estimate.emulation import CudaStepEmulation
from server.estimate.errors import EstimateError, InputMismatchError
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


def prepare(resolved: ResolvedModel, settings: StepSettings, batch_size: int, device: torch.device) -> tuple[
    torch.nn.Module, Batch, torch.optim.Optimizer, CudaStepEmulation
]:
    model = resolved.build(device)
    if settings.activation_checkpointing:
        enable_checkpointing(model, resolved.hf)
    batch = resolved.make_batch(batch_size, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(settings.optimizer, params, settings.optimizer_impl)
    return model, batch, optimizer, CudaStepEmulation(AUTOCAST_DTYPES[settings.precision])


def baseline_tensors(model: torch.nn.Module, batch: Batch) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers(), *batch.tensors()]


def run_steps(model: torch.nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, emulation: CudaStepEmulation,
              settings: StepSettings, mark: Callable[[str], None] = lambda _name: None) -> None:
    """The traced steps: the user's own step when the settings carry one, else the canned step."""
    if settings.user_step is not None:
        run_user_steps(settings.user_step, model, batch, emulation, steps=TRACED_STEPS, mark=mark)
    else:
        train_steps(model, batch, optimizer, emulation, steps=TRACED_STEPS,
                    micro_batches=settings.traced_micro_batches, mark=mark)


def trace_step(resolved: ResolvedModel, settings: StepSettings, batch_size: int,
               kernels: MetaKernels | None = None) -> StepTrace:
    """`kernels`: memoised meta kernels to share with other traces of the same model (server.estimate.meta_kernels)."""
    meta = torch.device("meta")
    model, batch, optimizer, emulation = prepare(resolved, settings, batch_size, meta)
    params = list(model.parameters())
    recorder = StorageRecorder(kernels=kernels)
    recorder.register(baseline_tensors(model, batch))
    origins = StepOrigins(recorder, model, optimizer)
    origins.register_baseline(batch.tensors())
    marks: dict[str, tuple[int, int]] = {}

    def mark(name: str) -> None:
        marks[name] = (len(recorder.trace.events), len(recorder.trace.ops))
        origins.mark(name)

    try:
        with recorder, origins:
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
