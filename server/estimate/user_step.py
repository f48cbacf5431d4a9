"""A training step of the user's own, in place of the canned one (`fleetprof estimate --local --step module:function`).

The contract (docs/guide-teams.md, "Your own training step"): `module:function` names a step factory

    def make_step(model: torch.nn.Module) -> Callable[..., None]

called once with the built model (on the device being estimated: `meta` for the trace, `cpu` to measure). It
creates its optimizers (any number, over any parameter groups) and returns `step(*args, **kwargs)`, which gets the
batch exactly as the model's forward takes it (the `--input` tensors, or `input_ids`/`labels` of a Hugging Face
model) and does one whole training step: forward pass(es), loss, backward(s), clipping, optimizer step(s),
zero_grad. It is called twice; the second call, with optimizer state allocated, is the steady state. Tensors it
creates should be put on the inputs' device (`torch.randn(n, d, device=x.device)`), as on any GPU.

What the estimator adds around it, so that the step can be written exactly as it runs on CUDA:
- `torch.autocast("cuda", dtype=...)` regions in the step are emulated (on meta and CPU builds, where real CUDA
  autocast disables itself), with the op lists of server.estimate.emulation;
- `loss.backward()` runs with that emulation active (a TorchFunctionMode is popped while it handles a call, so a
  plain `backward()` would leave it, and activation checkpointing's recomputed forwards with it);
- the optimizer part of the step (for the time estimate) starts at the step's first `optimizer.step()`.

This code runs only in the caller's own process (the `--local` path). Nothing here is reachable from a REST
request: `EstimateRequest` has no field for a step (`extra="forbid"`), and the API never calls `estimate()` with
`user_step`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode

from server.estimate.emulation import StepEmulation
from server.estimate.errors import UserStepError
from server.estimate.named_code import NamedCodeError, import_callable
from server.estimate.step import Batch

StepFactory = Callable[[torch.nn.Module], Callable[..., None]]


@dataclass(frozen=True)
class UserStep:
    """A step factory and the `module:function` it came from (the name shows in errors)."""

    name: str
    make: StepFactory


def load_user_step(spec: str) -> UserStep:
    """Import `package.module:function` (the caller's own code: only ever on the `--local` path)."""
    try:
        found = import_callable(spec, "step")
    except NamedCodeError as exc:
        raise UserStepError(str(exc)) from exc.__cause__
    return UserStep(spec, found)


def run_user_steps(
    user_step: UserStep,
    model: torch.nn.Module,
    batch: Batch,
    emulation: StepEmulation,
    *,
    steps: int,
    mark: Callable[[str], None] = lambda _name: None,
) -> None:
    """`steps` calls of the user's step, with the marks of `step.train_steps` (`stepN`, `stepN_optimizer`, `end`)."""
    model.train()
    try:
        step = user_step.make(model)
    except MemoryError:
        raise
    except Exception as exc:
        raise UserStepError(f"step factory {user_step.name!r} raised {type(exc).__name__}: {exc}") from exc
    if not callable(step):
        raise UserStepError(f"step factory {user_step.name!r} returned {type(step).__name__}, not a callable step")
    current: list[str] = []  # the step running now; its optimizer mark is set once, at its first optimizer.step()

    def before_optimizer(_optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if current:
            mark(f"{current.pop()}_optimizer")

    handle = register_optimizer_step_pre_hook(before_optimizer)
    try:
        with emulation, _cuda_autocast_emulated(emulation), _BackwardUnderEmulation():
            for i in range(steps):
                name = f"step{i}"
                mark(name)
                current[:] = [name]
                step(*batch.args, **batch.kwargs)
                if current:  # no optimizer stepped: the whole step counts as forward/backward
                    mark(f"{current.pop()}_optimizer")
    finally:
        handle.remove()
    mark("end")


class _BackwardUnderEmulation(TorchFunctionMode):
    """Pushed above the emulation: `Tensor.backward` is handled here, so only this mode is popped while the
    backward runs and the emulation below stays active (step._backward does the same for the canned step)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.backward:
            tensor, *rest = args
            gradient = kwargs.pop("gradient", rest[0] if rest else None)
            torch.autograd.backward(tensor, gradient, **kwargs)
            return None
        return func(*args, **kwargs)


@contextlib.contextmanager
def _cuda_autocast_emulated(emulation: StepEmulation) -> Iterator[None]:
    """While active, `torch.autocast("cuda", ...)` (and torch.cuda.amp.autocast) drive the emulation's autocast
    region instead of CUDA's. Nested regions (an `enabled=False` island) are a stack; only the innermost region's
    emulation context is ever open, so the emulation's own (non-reentrant) region is entered and left in order."""
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__, cls.__enter__, cls.__exit__
    initial_dtype = emulation.autocast_dtype
    stack: list[tuple[torch.dtype | None, contextlib.AbstractContextManager[None]]] = []

    def open_region(dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
        emulation.autocast_dtype = dtype
        region = emulation.autocast()
        region.__enter__()
        return region

    def init(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
             cache_enabled: bool | None = None) -> None:
        with warnings.catch_warnings():  # "CUDA is not available ... Disabling autocast": emulated instead
            warnings.simplefilter("ignore")
            original[0](self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self._emulated = (dtype or torch.float16) if enabled else None  # CUDA autocast's default is float16
        self._emulate = device_type == "cuda"

    def enter(self: Any) -> Any:
        if not getattr(self, "_emulate", False):
            return original[1](self)
        if stack:
            stack[-1][1].__exit__(None, None, None)
        stack.append((self._emulated, open_region(self._emulated)))
        return self

    def exit(self: Any, *exc: Any) -> Any:
        if not getattr(self, "_emulate", False):
            return original[2](self, *exc)
        _, region = stack.pop()
        region.__exit__(None, None, None)
        if stack:  # back in the enclosing region: reopen it (its weight-cast cache starts afresh)
            stack[-1] = (stack[-1][0], open_region(stack[-1][0]))
        return False

    cls.__init__, cls.__enter__, cls.__exit__ = init, enter, exit  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__, cls.__enter__, cls.__exit__ = original  # type: ignore[method-assign]
        emulation.autocast_dtype = initial_dtype
