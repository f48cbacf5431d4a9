"""Make a meta-device (or CPU) step behave like the CUDA step it stands for.

Three things differ between a CUDA step and a meta step, and all move memory:
- `torch.autocast("cuda")` does not apply to meta tensors (their dispatch keys carry no AutocastCUDA). We
  replay its rules one level up, as a `TorchFunctionMode` (above autograd, like autocast itself, so casts are
  recorded in the graph and the low-precision copies are what backward saves). The op lists are those of
  aten/src/ATen/autocast_mode.cpp for CUDA; leaf tensors that require grad (weights) are cast once per
  autocast region and cached, as autocast does.
- `scaled_dot_product_attention` on meta falls back to the math path, which materialises the (L x L)
  attention matrix; CUDA picks a fused kernel (flash, or memory-efficient for fp32/masks) that keeps only
  the output and a logsumexp. We route it to the fused CPU flash kernel, whose saved tensors match.
- `dropout` on CUDA is the fused `native_dropout` (a bool mask saved); elsewhere the unfused path saves a mask in
  the input's dtype. We route it to `native_dropout` (see `_fused_dropout`).

The same mode is used for the CPU reference step in validation, so the comparison isolates the tracer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# autocast_mode.cpp, CUDA "lower_precision_fp" list (names as torch functions / Tensor methods)
LOWER_PRECISION_OPS = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__",
    "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention",
})
# "fp32" list: inputs are cast up to float32
FP32_OPS = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "softplus", "layer_norm", "group_norm", "frobenius_norm", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss",
    "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp", "cross_entropy",
    "rms_norm",
})
# "fp32_set_opt_dtype": run in float32 by passing dtype=float32 (no upcast copy of the input)
FP32_DTYPE_OPS = frozenset({"prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum"})
# "promote": inputs cast to the widest floating type among them
PROMOTE_OPS = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
    "tensordot", "cat", "stack", "index_copy",
})


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


class CudaStepEmulation(TorchFunctionMode):
    """Autocast-for-CUDA rules and fused attention; `autocast_dtype=None` only routes attention."""

    def __init__(self, autocast_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.autocast_dtype = autocast_dtype
        self._autocast_active = False
        self._cast_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The region `torch.autocast` would cover: forward and loss. The weight-cast cache dies at exit."""
        self._autocast_active = self.autocast_dtype is not None
        try:
            yield
        finally:
            self._autocast_active = False
            self._cast_cache.clear()

    def _cast(self, t: Any, dtype: torch.dtype) -> Any:
        if not _is_float(t) or t.dtype == dtype or t.dtype == torch.float64:
            return t
        if t.is_leaf and t.requires_grad:  # autocast caches casts of weights for the whole region
            hit = self._cast_cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            cast = t.to(dtype)
            self._cast_cache[id(t)] = (t, cast)
            return cast
        return t.to(dtype)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._autocast_active:
            assert self.autocast_dtype is not None
            if name in LOWER_PRECISION_OPS:
                low = self.autocast_dtype
                args, kwargs = tree_map(lambda t: self._cast(t, low) if t is not None else t, (args, kwargs))
            elif name in FP32_OPS:
                args, kwargs = tree_map(lambda t: self._cast(t, torch.float32), (args, kwargs))
            elif name in FP32_DTYPE_OPS and "dtype" not in kwargs:
                if any(_is_float(a) and a.dtype in (torch.float16, torch.bfloat16) for a in args[:1]):
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif name in PROMOTE_OPS:
                floats = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if _is_float(t)]
                if floats and len({t.dtype for t in floats}) > 1:
                    wide = torch.float32 if any(t.dtype == torch.float32 for t in floats) else floats[0].dtype
                    args, kwargs = tree_map(lambda t: self._cast(t, wide), (args, kwargs))
        if name == "scaled_dot_product_attention" and not _mask_requires_grad(args, kwargs):
            return _fused_attention(*args, **kwargs)
        if name == "dropout":  # torch.nn.functional.dropout (input, p, training, inplace) or torch.dropout
            params = dict(zip(("input", "p", "train", "inplace"), args, strict=False))
            params.update({"train" if k == "training" else k: v for k, v in kwargs.items()})
            if not params.get("inplace", False):
                return _fused_dropout(params["input"], params.get("p", 0.5), params.get("train", True))
        return func(*args, **kwargs)


def _fused_dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """CUDA's dropout: `native_dropout`, which saves a bool mask (1 byte per element) for backward. On meta (and CPU)
    `torch.dropout` takes the unfused path instead (`input * bernoulli(1 - p) / (1 - p)`: a mask in the input's
    dtype, 4 bytes per element in fp32). aten/src/ATen/native/Dropout.cpp, `is_fused_kernel_acceptable`: CUDA,
    0 < p < 1, non-empty input."""
    if not train or not 0 < p < 1 or input.numel() == 0:
        return torch.dropout(input, p, train)
    return torch.native_dropout(input, p, train)[0]


def _mask_requires_grad(args: tuple, kwargs: dict) -> bool:
    # a learned bias as mask (T5's relative position bias): no fused CPU kernel differentiates it, so such
    # calls keep PyTorch's own choice (the math path on meta and CPU alike)
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    return isinstance(mask, torch.Tensor) and mask.requires_grad


def _fused_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> torch.Tensor:
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, dim=-3), value.repeat_interleave(rep, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # the fused kernels take an additive mask; CUDA's memory-efficient kernel converts the same way
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    # dropout_p is dropped: CUDA's flash / memory-efficient kernels regenerate the dropout mask from a
    # Philox seed in backward (nothing mask-sized is saved), while the CPU kernel refuses dropout > 0.
    # Memory is the same either way; the numbers computed are not (this step only exists to be measured).
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


class CpuStep:
    """The `device: cpu` step: traced on fake CPU tensors (torch._subclasses.FakeTensorMode), so PyTorch's own CPU
    dispatch applies as in a real CPU loop: `torch.autocast("cpu")` and its op lists, the CPU attention choice,
    oneDNN's LSTM, the for-loop optimizers. Nothing is emulated; the interface is `CudaStepEmulation`'s."""

    def __init__(self, autocast_dtype: torch.dtype | None = None) -> None:
        self.autocast_dtype = autocast_dtype

    def __enter__(self) -> CpuStep:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        dtype = self.autocast_dtype
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            yield


StepEmulation = CudaStepEmulation | CpuStep
