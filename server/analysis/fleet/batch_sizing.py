"""Batch-size right-sizing: how large a batch the job's device holds, from its own runs.

With runs of one job name at two or more batch sizes, peak memory is fitted as a + b·batch (least squares; `a`
is what does not grow with the batch: weights, gradients, optimizer state, the runtime; `b` the activations per
sample) and the largest batch whose predicted memory keeps SAFETY_MARGIN_FRACTION of the device free is
recommended. With runs at one batch size only, `a` is estimated from the model the hooks saw (parameter count x
bytes per parameter x copies the optimizer keeps) and everything above it is charged to the batch: `b` is then an
upper bound, so the batch recommended is a lower bound of what fits. Without the model either, the advice says
what is missing.

Memory is the signal the report has for the run: the framework peak reserved bytes (CUDA caching allocator, or
the process RSS on a CPU-only run), else the NVML peak used. The capacity is the device's: the GPU's memory
(from the telemetry or the catalogue), or on a CPU-only run the host's physical memory the hooks read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.analysis.base.gpu_catalog import GpuModel, find_model

SAFETY_MARGIN_FRACTION = 0.15  # as the memory target's (VPA's default safety margin)

# Copies of each parameter an optimizer keeps beside the weights and their gradients (fp32 state).
OPTIMIZER_STATE_COPIES = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adagrad": 1, "RMSprop": 1,
                          "Adadelta": 2, "SGD": 1, "ASGD": 2, "LBFGS": 2, "SparseAdam": 2}
_DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass
class BatchFit:
    fixed_bytes: float  # a: weights, optimizer state, context
    per_sample_bytes: float  # b: activations per sample
    r2: float | None
    runs: int
    residual_max_bytes: float | None = None  # largest |memory - fit| over the runs
    points: list[tuple[int, float]] = field(default_factory=list)  # (batch size, memory bytes) fitted


def fit_batch_memory(history: Sequence[tuple[int, float]]) -> BatchFit | None:
    """Least-squares memory ≈ a + b·batch over runs at different batch sizes; None with < 2 sizes or b ≤ 0."""
    pts = [(float(b), float(m)) for b, m in history if b and m is not None and not math.isnan(m)]
    if len({b for b, _ in pts}) < 2:
        return None
    x = np.array([b for b, _ in pts])
    y = np.array([m for _, m in pts])
    b, a = np.polyfit(x, y, 1)
    if b <= 0:
        return None
    resid = y - (a + b * x)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else None
    return BatchFit(float(a), float(b), r2, len(pts), float(np.max(np.abs(resid))),
                    [(int(bs), m) for bs, m in pts])


def max_batch_size(fit: BatchFit, capacity_bytes: float, *, margin: float = SAFETY_MARGIN_FRACTION) -> int | None:
    """Largest batch whose predicted memory stays under capacity less the safety margin."""
    usable = capacity_bytes * (1 - margin) - fit.fixed_bytes
    if usable <= 0:
        return None
    return int(usable // fit.per_sample_bytes)


@dataclass(frozen=True)
class BatchSizeAdvice:
    """One batch-size recommendation: `summary`, `reason`, `evidence` (the fit), `saving` (None: not known)."""

    summary: str
    reason: str
    evidence: dict[str, Any]
    saving: dict[str, Any] | None


def _memory_of(run: Mapping[str, Any]) -> tuple[float | None, str | None]:
    if run.get("peak_reserved_bytes") is not None:
        return float(run["peak_reserved_bytes"]), f"peak_reserved_bytes ({run.get('memory_signal') or 'framework'})"
    if run.get("peak_used_bytes") is not None:
        return float(run["peak_used_bytes"]), "peak_used_bytes (nvml)"
    return None, None


def capacity_of(run: Mapping[str, Any], catalog: Sequence[GpuModel]) -> tuple[float | None, str | None]:
    """The memory the run's batch has to fit in, and where that figure came from."""
    if run.get("memory_total_bytes"):
        return float(run["memory_total_bytes"]), "gpu_memory_total (nvml)"
    if run.get("gpu_name"):
        model = find_model(run["gpu_name"], tuple(catalog))
        if model is not None:
            return float(model.memory_bytes), f"catalogue:{model.name}"
    if run.get("device_memory_total_bytes"):
        return float(run["device_memory_total_bytes"]), f"hooks:{run.get('device_memory_source') or 'device'}"
    return None, None


def model_state_bytes(run: Mapping[str, Any]) -> tuple[float | None, list[str]]:
    """Weights + gradients + optimizer state from what the hooks saw; (None, what is missing) when unknown."""
    missing = [k for k in ("parameter_count", "optimizers") if not run.get(k)]
    if missing:
        return None, missing
    copies = [OPTIMIZER_STATE_COPIES.get(name) for name in run["optimizers"]]
    if any(c is None for c in copies):
        return None, [f"optimizer state size of {run['optimizers']}"]
    # autocast computes in low precision but keeps fp32 weights: the parameters' own dtype is what is stored.
    per_param = 4 if run.get("precision_source") == "autocast" else _DTYPE_BYTES.get(run.get("precision") or "", 4)
    return float(run["parameter_count"]) * per_param * (2 + max(c or 0 for c in copies)), []


def batch_size_advice(runs: Sequence[Mapping[str, Any]], catalog: Sequence[GpuModel], *,
                      margin: float = SAFETY_MARGIN_FRACTION) -> BatchSizeAdvice | None:
    """Advice for the next run, from the `rightsizing_inputs` of the runs of one job name (newest last); None
    when no run knows its batch size."""
    sized = [r for r in runs if r.get("batch_size")]
    if not sized:
        return None
    last = sized[-1]
    current = int(last["batch_size"])
    capacity, capacity_source = capacity_of(last, catalog)
    points, signals = [], set()
    for r in sized:
        mem, signal = _memory_of(r)
        if mem is not None:
            points.append((int(r["batch_size"]), mem))
            signals.add(signal)
    base_evidence: dict[str, Any] = {
        "batch_size": current, "memory_signal": sorted(s for s in signals if s), "memory_total_bytes": capacity,
        "capacity_source": capacity_source, "margin_fraction": margin,
        "points": [{"batch_size": b, "memory_bytes": m} for b, m in points]}
    if not points:
        return BatchSizeAdvice("Batch size needs a memory measurement",
                               "no run of this job recorded its peak memory (no hooks and no GPU telemetry)",
                               {**base_evidence, "missing": ["peak memory"]}, None)
    fit = fit_batch_memory(points)
    method = "fit"
    if fit is None:
        if len({b for b, _ in points}) >= 2:
            return BatchSizeAdvice("Batch size: memory does not grow with it here",
                                   "the runs at different batch sizes give a fit whose memory per sample is not "
                                   "positive: the peak is set by something else", base_evidence, None)
        fixed, missing = model_state_bytes(last)
        if fixed is None:
            return BatchSizeAdvice(
                "Batch size needs a second run at another batch size",
                f"all runs so far used batch size {current}: a fit of memory against batch size needs two sizes, "
                f"and the one-run estimate needs the model the hooks read ({', '.join(missing)} unknown)",
                {**base_evidence, "missing": ["a run at another batch size", *missing]}, None)
        peak = max(m for b, m in points if b == current)
        if peak <= fixed:
            return None
        fit = BatchFit(fixed, (peak - fixed) / current, None, len(points), None, points)
        method = "one_run_model_state"
    evidence = {**base_evidence, "method": method, "fixed_bytes": fit.fixed_bytes,
                "per_sample_bytes": fit.per_sample_bytes, "r2": fit.r2, "residual_max_bytes": fit.residual_max_bytes,
                "runs": fit.runs}
    formula = (f"memory ≈ {fit.fixed_bytes / 2**30:.2f} GiB + {fit.per_sample_bytes / 2**20:.2f} MiB × batch "
               + (f"fitted over {fit.runs} runs at batch sizes {sorted({b for b, _ in points})}" if method == "fit"
                  else f"from one batch size ({current}), the fixed part being the model's weights, gradients and "
                       f"{'/'.join(last.get('optimizers') or [])} state ({last.get('parameter_count')} parameters): "
                       "a lower bound of the batch that fits"))
    if capacity is None:
        return BatchSizeAdvice("Batch size: the device's memory is unknown", f"{formula}; no capacity known to fit "
                               "it in (no GPU memory total, no catalogue GPU, no hooks)",
                               {**evidence, "missing": ["device memory total"]}, None)
    best = max_batch_size(fit, capacity, margin=margin)
    usable = capacity * (1 - margin)
    predicted_now = fit.fixed_bytes + fit.per_sample_bytes * current
    evidence.update(max_batch_size=best, predicted_at_batch_size_bytes=predicted_now)
    where = f"{capacity / 2**30:.1f} GiB ({capacity_source})"
    if best is None or best < current:
        return BatchSizeAdvice(
            f"Batch size {current} leaves less than {margin:.0%} of memory free: use at most {best or 0}",
            f"{formula}; batch {current} needs {predicted_now / 2**30:.2f} GiB of {where}", evidence,
            None)
    if best == current:
        return None
    saving = {"unused_bytes": max(0.0, usable - predicted_now),
              "optimizer_steps_fraction": 1 - current / best}  # fewer steps per epoch at the larger batch
    return BatchSizeAdvice(
        f"Batch size up to {best} fits (now {current})",
        f"{formula}; {best} keeps {margin:.0%} of {where} free; a larger batch may need a retuned learning rate",
        evidence, saving)
