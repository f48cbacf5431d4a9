"""Count recurrent modules (nn.LSTM / nn.GRU / nn.RNN) as the few calls cuDNN makes of them on CUDA.

On CUDA, `torch.lstm` / `gru` / `rnn_tanh` / `rnn_relu` run through cuDNN (aten/src/ATen/native/cudnn/RNN.cpp,
`_cudnn_rnn` forward and `_cudnn_rnn_backward`): one aten op per module call, whatever the sequence length,
issuing a few kernels per layer and direction. On `meta` (and CPU without oneDNN) the same call is
CompositeImplicitAutograd and decomposes into per-time-step `mm` / `sigmoid` / `tanh` / `mul` ops, each of which
the roofline (server.estimate.roofline) would charge a kernel launch floor and a host issue cost: a 32-step LSTM
traced as ~1000 ops where the H100 ran 34 kernels.

The decomposed trace is kept as it is for memory (its saved per-step tensors stand in for cuDNN's reserve space,
whose size cuDNN does not document: `cudnnGetRNNTempSpaceSizes` answers it at run time, and PyTorch's meta kernel
for `_cudnn_rnn` returns an empty reserve). Only the op costs are regrouped (`tracer.FusedGroup`):
- forward: a pre/post forward hook on every `nn.RNNBase` module routes the costs of the ops its forward runs into
  one group per module call;
- backward: at the end of the forward, the autograd nodes the call created (walked from its outputs back to its
  inputs' nodes and the weights' AccumulateGrad) get a pre-hook that routes the costs of what the node runs into
  a second group; the engine's summing of a node's output gradients (InputBuffer adds, run after the node's own
  hooks) goes with the node that produced them. A pre-hook on the nodes just outside the call (the input's
  `grad_fn`, the weights' AccumulateGrad) and any module's forward or a step mark end the group's run.
Each group becomes `layers x directions` OpCosts (forward) or twice that (backward: data, then weights) sharing its
FLOPs and bytes: that many launch floors and host issue slots per module call. Used for `device: cuda` only;
`device: cpu` traces the oneDNN path PyTorch itself picks (server.estimate.emulation.CpuStep).

Not modelled: the cuDNN RNN workspace (allocated through the caching allocator, size from cuDNN at run time), and
a branch of the model unrelated to the recurrent module whose backward nodes the engine runs between the module's
nodes (its ops would join the group).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves

from server.estimate.tracer import FusedGroup, StorageRecorder


def cudnn_calls(module: torch.nn.RNNBase, backward: bool = False) -> int:
    """The OpCosts one call of `module` counts as: one per layer and direction forward (`cudnnRNNForward`), two
    backward (`_cudnn_rnn_backward` calls `cudnnRNNBackwardData_v8`, then `cudnnRNNBackwardWeights_v8`)."""
    return module.num_layers * (2 if module.bidirectional else 1) * (2 if backward else 1)


def _grad_fns(value: Any) -> list[Any]:
    return [t.grad_fn for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _call_nodes(inputs: Any, outputs: Any) -> tuple[list[Any], list[Any]]:
    """(the autograd nodes the module call created, the nodes just outside them): walked from the outputs'
    nodes, stopping at the inputs' nodes, at AccumulateGrad (weights) and at nodes older than every input's."""
    stop = {id(n) for n in _grad_fns(inputs)}
    oldest = max((n._sequence_nr() for n in _grad_fns(inputs)), default=-1)
    inside: dict[int, Any] = {}
    outside: dict[int, Any] = {}
    pending = _grad_fns(outputs)
    while pending:
        node = pending.pop()
        if id(node) in inside or id(node) in outside:
            continue
        if id(node) in stop or type(node).__name__ == "AccumulateGrad" or node._sequence_nr() <= oldest:
            outside[id(node)] = node
            continue
        inside[id(node)] = node
        pending.extend(n for n, _ in node.next_functions if n is not None)
    return list(inside.values()), list(outside.values())


@contextlib.contextmanager
def cudnn_rnn_groups(recorder: StorageRecorder) -> Iterator[None]:
    """While active, the costs of `nn.RNNBase` modules' forwards and of their backward go to `recorder` grouped as
    cuDNN runs them (see the module docstring)."""

    def pre(module: torch.nn.Module, _args: object) -> None:
        # any forward ends the run of a backward group (a micro-batch's forward after backward, a recompute)
        recorder.fused = FusedGroup(cudnn_calls(module)) if isinstance(module, torch.nn.RNNBase) else None

    def post(module: torch.nn.Module, args: object, out: object) -> None:
        if not isinstance(module, torch.nn.RNNBase):
            return
        recorder.fused = None
        if not torch.is_grad_enabled():
            return
        inside, outside = _call_nodes(args, out)
        if not inside:
            return
        group = FusedGroup(cudnn_calls(module, backward=True))

        def enter(_grad_outputs: object) -> None:
            recorder.fused = group

        def leave(_grad_outputs: object) -> None:
            recorder.fused = None

        for node in inside:
            node.register_prehook(enter)
        for node in outside:
            node.register_prehook(leave)

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield
    finally:
        recorder.fused = None
        for h in handles:
            h.remove()
