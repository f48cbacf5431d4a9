"""Time and energy per step from FLOPs and bytes per op against a GPU's peaks (a roofline model).

Per op: t = max(flops / (peak_flops x e_compute), bytes / (bandwidth x e_memory)), floored at a per-kernel
launch cost, summed over the step (ops on one stream run one after the other). FLOPs come from PyTorch's
own `torch.utils.flop_counter` formulas (matmul, conv, attention); bytes are the sizes of each op's tensor
inputs and outputs (every operand read or written once from device memory: no cache reuse, no fusion).

The central estimate uses efficiency factors from typical eager-mode training (documented in `EFFICIENCY`);
the band goes from the pure roofline at 100% of peak with a 2 us launch floor (`low`, a floor no real run
beats) to twice the central estimate (`high`: small kernels, poor occupancy, host-bound steps). Energy is
time x TDP x a power fraction that grows with the compute-bound share of the step (memory- and launch-bound
steps draw well below TDP); see `power_fraction`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from server.analysis.base.gpu_catalog import GpuModel
from server.analysis.energy import power_model
from server.analysis.energy.power_model import WAITING_POWER_FRACTION


@dataclass(frozen=True)
class Efficiency:
    compute_fraction: float = 0.6  # large GEMMs/convs reach 70-80% of peak, small ones 30-50%
    memory_fraction: float = 0.7  # elementwise kernels reach 70-90% of DRAM bandwidth
    launch_floor_s: float = 5e-6  # the shortest a kernel takes on the GPU (launch latency included)
    high_factor: float = 2.0  # upper end of the band, x central
    # The host's cost per traced op in eager mode (Python, nn.Module calls, autograd, dispatcher, launch): the GPU
    # cannot finish a step before the host has issued it. Measured on an H100 host (bench/dispatch_probe.py, the
    # zoo rows of bench/zoo_rows.py: host time per step / traced ops = 46-68 us, median 59 us, torch 2.11,
    # Python 3.12); checked on the held-out rows (bench/results/gpu_nvidia_h100_80gb_hbm3_heldout.md). Faster
    # hosts issue ops in 10-20 us: the band's low end.
    host_per_op_s: float = 59e-6
    host_per_op_low_s: float = 12e-6
    # Power drawn with clocks up but the SMs mostly waiting on the host, as a fraction of TDP (the power rule's
    # own figure, server.analysis.energy.power_model)
    waiting_power_fraction: float = WAITING_POWER_FRACTION


EFFICIENCY = Efficiency()
_LOW_LAUNCH_FLOOR_S = 2e-6


class OpCost(NamedTuple):
    flops: float
    bytes: float
    kind: str  # "matmul", "conv", "attention", "other"
    lowp: bool  # fp16/bf16 operands: tensor-core peak applies


_aten = torch.ops.aten
_ATTENTION_FWD = {_aten._scaled_dot_product_flash_attention_for_cpu.default}
_ATTENTION_BWD = {_aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
_CONV = {"convolution", "convolution_backward", "_convolution"}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def op_cost(func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost | None:
    tensors_in = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    tensors_out = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    moved = sum(_nbytes(t) for t in tensors_in) + sum(_nbytes(t) for t in tensors_out)
    if not tensors_in and not tensors_out:
        return None
    flops = 0.0
    kind = "other"
    if func in _ATTENTION_FWD or func in _ATTENTION_BWD:
        # forward(query, key, value, ...); backward(grad_out, query, key, value, ...)
        q, k = (args[0], args[1]) if func in _ATTENTION_FWD else (args[1], args[2])
        b_h = q.numel() // (q.shape[-2] * q.shape[-1])
        per = b_h * q.shape[-2] * k.shape[-2] * q.shape[-1]
        flops = (4.0 if func in _ATTENTION_FWD else 10.0) * per
        kind = "attention"
    else:
        counter = flop_registry.get(func._overloadpacket)
        if counter is not None:
            try:
                flops = float(counter(*args, **kwargs, out_val=out))
            except Exception:  # a formula that does not cover this overload: count bytes only
                flops = 0.0
            kind = "conv" if func._overloadpacket.__name__ in _CONV else "matmul"
    lowp = any(t.dtype in (torch.float16, torch.bfloat16) for t in tensors_in[:2])
    return OpCost(flops, float(moved), kind, lowp)


def _peak_flops(gpu: GpuModel, cost: OpCost, autocast_dtype: str | None) -> float:
    if cost.kind == "other":
        return gpu.peak_flops("fp32")
    if cost.lowp:
        return gpu.peak_flops(autocast_dtype or "fp16")
    if cost.kind == "conv" and gpu.peak_bf16_tflops:
        # cuDNN convolutions use TF32 by default on Ampere and later (torch.backends.cudnn.allow_tf32):
        # TF32 dense peak is half the FP16 tensor-core peak on these parts
        return gpu.peak_flops("fp16") / 2
    return gpu.peak_flops("fp32")  # matmul TF32 is off by default (torch.backends.cuda.matmul.allow_tf32)


@dataclass(frozen=True)
class StepTime:
    central_s: float
    low_s: float
    high_s: float
    compute_bound_fraction: float  # of the GPU's busy time
    gpu_s: float = 0.0  # the GPU's busy time (central): the step's time when the host keeps ahead of it
    host_s: float = 0.0  # the host's time to issue the step's ops (central)

    @property
    def host_bound(self) -> bool:
        return self.host_s > self.gpu_s

    @property
    def busy_fraction(self) -> float:
        """Share of the step the GPU computes (1.0 when the host keeps ahead)."""
        return min(1.0, self.gpu_s / self.central_s) if self.central_s else 0.0


def step_time(
    ops: Sequence[OpCost], gpu: GpuModel, autocast_dtype: str | None, eff: Efficiency = EFFICIENCY
) -> StepTime:
    """The step's time: the GPU's busy time (per op, the roofline floored at a kernel's launch) or the host's time
    to issue the ops, whichever is longer (the host runs ahead of the GPU, asynchronously, while it can)."""
    gpu_s = low = compute_bound = 0.0
    bandwidth = gpu.mem_bandwidth_bytes_per_s
    for cost in ops:
        peak = _peak_flops(gpu, cost, autocast_dtype)
        t_compute, t_memory = cost.flops / peak, cost.bytes / bandwidth
        low += max(t_compute, t_memory, _LOW_LAUNCH_FLOOR_S)
        t = max(t_compute / eff.compute_fraction, t_memory / eff.memory_fraction, eff.launch_floor_s)
        gpu_s += t
        if t_compute / eff.compute_fraction >= max(t_memory / eff.memory_fraction, eff.launch_floor_s):
            compute_bound += t
    host_s = len(ops) * eff.host_per_op_s
    central = max(gpu_s, host_s)
    low = max(low, len(ops) * eff.host_per_op_low_s)
    return StepTime(central, low, central * eff.high_factor, compute_bound / gpu_s if gpu_s else 0.0, gpu_s, host_s)


def power_fraction(compute_bound_fraction: float, busy_fraction: float = 1.0,
                   eff: Efficiency = EFFICIENCY) -> float:
    """Share of TDP drawn: the one power rule (server.analysis.energy.power_model) with this efficiency's
    waiting power."""
    return power_model.power_fraction(compute_bound_fraction, busy_fraction, eff.waiting_power_fraction)
