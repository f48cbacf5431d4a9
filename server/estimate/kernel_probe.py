"""CPU kernels whose memory a fake trace cannot see, measured once per shape by running them for real.

Found with server/estimate/explain.py on the zoo (an LSTM at -56 %, ResNet-18 at batch 1 at -5.8 %):

oneDNN's LSTM (`aten::mkldnn_rnn_layer`, PyTorch's CPU path for LSTM in training) returns a workspace that backward
reads: its fake kernel (torch/_meta_registrations.py) returns 0 bytes where oneDNN needs several times the output
(270 KB for one 16-step, 64-unit layer at batch 4), and both the forward and the backward allocate scratch buffers
inside the kernel (reorders of weights and states to oneDNN's layouts). Their sizes come from oneDNN's primitive
descriptors (padding, blocking per ISA), not from a formula PyTorch exposes. So, for the ops listed in
`PROBED_OPS` only, `KernelProbe` runs the real CPU kernel on zero-filled tensors of the traced shapes under
`torch.profiler(profile_memory=True)` and replays on the fake side what it saw: the true size of each output, and
the peak of the kernel's own transient allocations as one buffer allocated and freed right after the outputs.
Results are cached per (op, shapes, dtypes, arguments). Cost: one real forward/backward of that layer per distinct
shape, at most a few per model; memory: the layer's inputs and outputs, once, on the estimating machine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

_aten = torch.ops.aten
PROBED_OPS = frozenset({
    _aten.mkldnn_rnn_layer.default, _aten.mkldnn_rnn_layer_backward.default,
    # CPU convolutions pick oneDNN or the im2col kernels (slow_conv2d, slow_conv_transpose2d) per shape; the latter
    # allocate the column buffer (C x kh x kw x H_out x W_out) inside the kernel, forward and backward
    _aten.convolution.default, _aten.convolution_backward.default,
})
# in bf16 / fp16 (and, for sums, bool and integer inputs) only: oneDNN's low-precision GEMMs pack and convert
# operands inside the kernel, the CPU reductions accumulate in a converted copy (a bool mask summed: an int64 copy,
# amax's backward in the TCN) and attention backward in fp32 buffers (rnn_tanh in bf16: -16 % without them)
LOW_PRECISION_PROBED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.sum.dim_IntList, _aten.sum.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
})
_LOW = (torch.bfloat16, torch.float16)
_SUMS = (_aten.sum.dim_IntList, _aten.sum.default)


def probed(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in PROBED_OPS:
        return True
    if func not in LOW_PRECISION_PROBED_OPS:
        return False
    if func in _SUMS and not (args[0].is_floating_point() or args[0].is_complex()):
        return True
    return any(isinstance(x, torch.Tensor) and x.dtype in _LOW for x in tree_flatten((args, kwargs))[0])


def _key(func: Any, args: tuple, kwargs: dict) -> tuple:
    leaves, _ = tree_flatten((args, kwargs))
    return (func, *((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves))


def measure_kernel(func: Any, args: tuple, kwargs: dict) -> tuple[list[int], int]:
    """Run `func` on zero tensors of the same shapes: (bytes of each tensor output, peak transient bytes)."""
    with unset_fake_temporarily(), _disable_current_modes():
        def real(x: Any) -> Any:
            # same layout and the same requires_grad: oneDNN picks its path (and its copies) by both
            if not isinstance(x, torch.Tensor):
                return x
            t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).zero_()
            return t.requires_grad_(x.requires_grad) if x.is_floating_point() else t

        real_args, real_kwargs = tree_map(real, (args, kwargs))
        # called where a dispatch mode runs: below autograd, as the real step runs the kernel
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                torch._C._AutoDispatchBelowAutograd():
            out = func(*real_args, **real_kwargs)
        outputs = [t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) else 0 for t in tree_flatten(out)[0]]
        assert prof.profiler is not None and prof.profiler.kineto_results is not None
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        sizes = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events))
        live = peak = 0
        for _, _, nbytes in sizes:
            live += nbytes
            peak = max(peak, live)
        del out
    return outputs, max(0, peak - sum(outputs))


class KernelProbe(TorchDispatchMode):
    """Above the recorder (entered after it): what it allocates on the fake side, the recorder records."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple, tuple[list[int], int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not probed(func, args, kwargs):
            return func(*args, **kwargs)
        key = _key(func, args, kwargs)
        measured = self._cache.get(key)
        if measured is None:
            measured = self._cache[key] = measure_kernel(func, args, kwargs)
        sizes, transient = measured
        out = func(*args, **kwargs)
        flat, spec = tree_flatten(out)
        fixed = []
        changed = False
        for t, nbytes in zip(flat, sizes, strict=True):
            if isinstance(t, FakeTensor) and t.untyped_storage().nbytes() < nbytes:
                # a buffer the fake kernel leaves empty (the workspace): the real size, as raw bytes
                t = torch.empty(nbytes, dtype=torch.uint8, device=t.device)
                changed = True
            fixed.append(t)
        if transient:
            scratch = torch.empty(transient, dtype=torch.uint8, device="cpu")
            del scratch
        return spec.unflatten(fixed) if changed else out
