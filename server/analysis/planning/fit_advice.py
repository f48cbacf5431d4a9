"""Fit advice for a job that ran out of memory or peaked within 5 % of its GPU's capacity: which modules to
checkpoint, what AMP bf16 would save, the largest batch that fits. Each a recommendation with its numbers.

Pure: reads the report as a document (memory, the layer table `time.layers`, the measured breakdown
`optimization.memory_breakdown`) and returns `Recommendation`-shaped dicts.

The rules, and what each figure is:
- need: the peak less 95 % of capacity, the least that takes the job out of the near-capacity band; after an OOM the
  recorded peak is capped by the capacity, so the true need is at least that ("at least" in the wording).
- checkpointing: a module's `activation_bytes` (memory its forward allocated, from the layer hook) is what
  checkpointing frees during backward, less its output, which stays (unknown here: the figure is an upper bound);
  the cost is one more forward of it per step (`forward_s`). Modules are taken by bytes per recompute second, never
  one inside another already taken, until the need is met.
- AMP bf16: autocast runs matmuls and convolutions in bf16, so activations they save halve; the fp32 weights stay,
  and autocast caches a bf16 copy of each weight during the forward (+ weights / 2). From the estimator's fp32 and
  bf16 runs where given (same model), else from the activation share with that correction when the weights are
  known.
- batch: from the memory-vs-batch fit over runs where one exists; else from the activation share, taking
  activations as proportional to the batch (memory = (peak - activations) + activations / batch x batch); the
  largest batch that leaves 5 % free, or none when the part that does not scale already leaves less.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetprof.report import Recommendation
from fleetprof.units import size
from server.analysis.fleet.batch_sizing import BatchFit, max_batch_size
from server.analysis.fleet.rightsizing import recommendation

NEAR_CAPACITY_FRACTION = 0.95
FIT_MARGIN_FRACTION = 1 - NEAR_CAPACITY_FRACTION  # "fits": out of the near-capacity band


@dataclass(frozen=True)
class AmpEstimate:
    """The estimator's peak for the same model and batch in fp32 and under bf16 autocast."""

    fp32_peak_bytes: int
    bf16_peak_bytes: int


@dataclass(frozen=True)
class CheckpointChoice:
    module: str
    saved_bytes: int  # upper bound: the module's output stays
    recompute_s: float  # one more forward per step


def near_capacity(peak_bytes: int | None, capacity_bytes: int | None, oom: bool) -> bool:
    if oom:
        return True
    if peak_bytes is None or not capacity_bytes:
        return False
    return peak_bytes >= NEAR_CAPACITY_FRACTION * capacity_bytes


def checkpoint_plan(layers: Sequence[Mapping[str, Any]], need_bytes: int) -> list[CheckpointChoice]:
    """Modules to checkpoint, best bytes per recompute second first, none nested in another, until `need_bytes`."""
    has_children = {r.get("parent") for r in layers}
    # the root (no parent, others under it) is the whole model: checkpointing it keeps nothing less
    rows = [r for r in layers if r.get("activation_bytes") and r.get("forward_s") is not None
            and not (r.get("parent") is None and r["module"] in has_children)]
    rows.sort(key=lambda r: -r["activation_bytes"] / max(r["forward_s"], 1e-9))
    parents = {r["module"]: r.get("parent") for r in layers}

    def ancestors(module: str) -> set[str]:
        out, p = set(), parents.get(module)
        while p is not None and p not in out:
            out.add(p)
            p = parents.get(p)
        return out

    chosen: list[CheckpointChoice] = []
    saved = 0
    for r in rows:
        if saved >= need_bytes:
            break
        m = r["module"]
        if any(c.module in ancestors(m) or m in ancestors(c.module) for c in chosen):
            continue
        chosen.append(CheckpointChoice(m, int(r["activation_bytes"]), float(r["forward_s"])))
        saved += int(r["activation_bytes"])
    return chosen


def amp_bf16_saving(activation_bytes: int | None, weight_bytes: int | None,
                    estimate: AmpEstimate | None) -> tuple[int, str] | None:
    """(bytes saved, how it was found), or None when neither the estimator nor the activations are known."""
    if estimate is not None:
        return estimate.fp32_peak_bytes - estimate.bf16_peak_bytes, "the estimator's fp32 and bf16-autocast runs"
    if not activation_bytes:
        return None
    if weight_bytes is None:
        return activation_bytes // 2, ("half the measured activations (bf16 copies of the weights that autocast "
                                       "caches not counted: weights unknown)")
    return activation_bytes // 2 - weight_bytes // 2, "half the measured activations, less the bf16 weight copies"


def largest_batch(peak_bytes: int, capacity_bytes: int, batch_size: int | None, activation_bytes: int | None,
                  batch_fit: BatchFit | None) -> tuple[int | None, BatchFit, str] | None:
    """(largest batch leaving 5 % free, or None when even the part that does not scale leaves less; the fit;
    how it was found), or None without a fit or the figures to make one."""
    if batch_fit is not None:
        fit, how = batch_fit, f"memory-vs-batch fit over {batch_fit.runs} runs"
    elif batch_size and activation_bytes:
        fit = BatchFit(fixed_bytes=float(peak_bytes - activation_bytes), per_sample_bytes=activation_bytes / batch_size,
                       r2=None, runs=1)
        how = "this run's activations taken as proportional to the batch"
    else:
        return None
    best = max_batch_size(fit, capacity_bytes, margin=FIT_MARGIN_FRACTION)
    return (best if best else None), fit, how


def _part(breakdown: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        part = breakdown.get(key) or {}
        if part.get("bytes") is not None:
            return int(part["bytes"])
    return None


def fit_recommendations(report: Mapping[str, Any], *, batch_fit: BatchFit | None = None,
                        amp_estimate: AmpEstimate | None = None) -> list[Recommendation]:
    """The fit recommendations for a job near or past capacity; [] for any other job."""
    mem = report.get("memory") or {}
    capacity = mem.get("memory_total_bytes")
    # what must fit on the device: NVML's used memory (context included), else the allocator's reserved
    peak = mem.get("peak_used_bytes") or mem.get("peak_reserved_bytes")
    oom = bool(mem.get("oom_detected") or mem.get("oom_suspected"))
    if not capacity or peak is None or not near_capacity(peak, capacity, oom):
        return []
    need = max(int(peak - NEAR_CAPACITY_FRACTION * capacity), 0)
    at_least = "at least " if oom else ""
    why = (f"the job ran out of memory on {size(capacity)}" if oom
           else f"its peak {size(peak)} is within 5 % of {size(capacity)}")
    breakdown = (report.get("optimization") or {}).get("memory_breakdown") or {}
    activations = _part(breakdown, "activations", "step_allocations")
    activations_source = ("activations" if _part(breakdown, "activations") is not None
                          else "step allocations (activations and temporaries together)" if activations else None)
    weights = _part(breakdown, "weights")
    recs: list[Recommendation] = []

    layers = (report.get("time") or {}).get("layers") or []
    plan = checkpoint_plan(layers, need)
    if plan:
        saved = sum(c.saved_bytes for c in plan)
        recompute = sum(c.recompute_s for c in plan)
        recs.append(recommendation(
            "activation_checkpointing",
            f"Checkpoint {', '.join(c.module for c in plan)}: up to {size(saved)} less for {recompute * 1e3:.1f} ms "
            "more per step",
            f"{why}; {at_least}{size(need)} must go to leave 5 % free. From the layer table: each module's "
            "activations (freed until backward, less its output: an upper bound) against one more forward of it",
            {"need_bytes": need, "modules": [c.__dict__ for c in plan], "peak_bytes": peak,
             "capacity_bytes": capacity, "meets_need": saved >= need},
            {"bytes": saved, "extra_step_s": recompute}))

    amp = amp_bf16_saving(activations, weights, amp_estimate)
    if amp is not None and amp[0] > 0:
        recs.append(recommendation(
            "amp_bf16", f"AMP bf16 autocast: about {size(amp[0])} less",
            f"{why}; {at_least}{size(need)} must go. Saving from {amp[1]}"
            + (f"; the activations are the breakdown's {activations_source}" if amp_estimate is None else ""),
            {"need_bytes": need, "activation_bytes": activations, "activations_source": activations_source,
             "weight_bytes": weights, "method": amp[1],
             "peak_bytes": peak, "capacity_bytes": capacity, "meets_need": amp[0] >= need},
            {"bytes": amp[0]}))

    batch = largest_batch(peak, capacity, report.get("batch_size"), activations, batch_fit)
    if batch is not None:
        best, fit, how = batch
        now = report.get("batch_size")
        summary = (f"Largest batch that fits: {best}" + (f" (now {now})" if now else "") if best is not None
                   else f"No batch size leaves 5 % free: {size(fit.fixed_bytes)} does not scale with the batch")
        recs.append(recommendation(
            "batch_size_fit", summary,
            f"{why}; from {how}: memory ≈ {size(fit.fixed_bytes)} + {size(fit.per_sample_bytes)} × batch, "
            f"keeping {FIT_MARGIN_FRACTION:.0%} of {size(capacity)} free"
            + ("; the peak of a run that ran out is a lower bound, so this batch is an upper bound" if oom else ""),
            {"largest_batch": best, "batch_size": now, "method": how, "capacity_bytes": capacity,
             "fixed_bytes": fit.fixed_bytes, "per_sample_bytes": fit.per_sample_bytes,
             "activation_bytes": activations, "peak_bytes": peak},
            None))
    return recs
