"""The training step that is traced on `meta` and measured on CPU: one code path for both.

Per optimizer step: `micro_batches` x (forward + loss under the autocast region, backward), then
`optimizer.step()` and `zero_grad(set_to_none=True)`. The model output is dropped once the loss
is computed and the loss when its micro-batch ends (as HF Trainer does), never held into the next iteration.
GradScaler (fp16) is left out: its unscale works in place and its state is a few scalars.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from server.estimate.emulation import StepEmulation


def make_optimizer(name: str, params: list[torch.nn.Parameter], impl: str = "foreach") -> torch.optim.Optimizer:
    foreach = impl == "foreach"
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=foreach)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=foreach)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-3, foreach=foreach)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3, foreach=foreach)
    raise ValueError(f"unknown optimizer {name!r}")


@dataclass
class Batch:
    args: list[torch.Tensor] = field(default_factory=list)
    kwargs: dict[str, torch.Tensor] = field(default_factory=dict)
    class_targets: bool = False  # an (N, C) output gets cross-entropy against random class indices

    def tensors(self) -> list[torch.Tensor]:
        return [*self.args, *self.kwargs.values()]


def compute_loss(output: Any, batch: Batch) -> torch.Tensor:
    """HF outputs carry `.loss`; an (N, C) tensor with targets gets cross-entropy; anything else its mean."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if hasattr(output, "last_hidden_state"):
        output = output.last_hidden_state
    elif isinstance(output, (tuple, list)):
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}, not a tensor or an output with .loss")
    if batch.class_targets and output.dim() == 2:
        # drawn here because only the output knows C; N int64 indices, allocated in the step on meta and CPU alike
        targets = torch.randint(0, output.shape[1], (output.shape[0],), device=output.device)
        return F.cross_entropy(output, targets)
    return output.float().mean() if output.dtype != torch.float32 else output.mean()


def train_steps(
    model: torch.nn.Module,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    emulation: StepEmulation,
    *,
    steps: int = 2,
    micro_batches: int = 1,
    mark: Callable[[str], None] = lambda _name: None,
) -> None:
    model.train()
    with emulation:
        for step in range(steps):
            mark(f"step{step}")
            for _ in range(micro_batches):
                _forward_backward(model, batch, emulation, micro_batches)
            mark(f"step{step}_optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    mark("end")


def _forward_backward(model: torch.nn.Module, batch: Batch, emulation: StepEmulation, scale: int) -> None:
    with emulation.autocast():
        output = model(*batch.args, **batch.kwargs)
        loss = compute_loss(output, batch)
        del output
        if scale > 1:
            loss = loss / scale
    # a second region for backward: torch.utils.checkpoint recomputes forwards under the autocast state of
    # the original forward; nothing else in backward is a torch function, so this only affects recomputes
    with emulation.autocast():
        _backward(loss)


def _backward(loss: torch.Tensor) -> None:
    """`loss.backward()` without passing through torch-function handling: a TorchFunctionMode is popped
    while it handles a call, so `loss.backward()` would run the whole backward (and activation
    checkpointing's recomputed forwards) outside the emulation. The engine call keeps it active."""
    run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if run is None:  # pragma: no cover - older torch
        loss.backward()
        return
    run((loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True, accumulate_grad=True)
