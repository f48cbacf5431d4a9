"""The report's `optimization` section: assembles the offset plan (`packing`), the swap plan (`swap`) and the
fragmentation findings (`fragmentation`) of one allocation trace.

It sits above the three planners so that none of them imports another's assembler (packing and fragmentation
used to import each other).
"""

from __future__ import annotations

import numpy as np

from fleetprof.report import AllocConfAdvice
from server.analysis.planning.alloc_conf_advice import alloc_conf_recommendation
from server.analysis.planning.fragmentation import fragmentation_findings
from server.analysis.planning.packing import DEFAULT_ALIGNMENT_BYTES, OffsetPlan, plan_offsets, verify_plan
from server.analysis.planning.swap import SwapPlan, plan_swaps, swap_section
from server.analysis.traces.alloc_trace import AllocationTrace
from server.analysis.traces.memory_breakdown import measured_breakdown
from server.analysis.traces.module_spans import ModuleSpans


def _modules(trace: AllocationTrace, module_spans: ModuleSpans | None) -> list[str | None] | None:
    """Per allocation, the top-level module whose forward was running when it was made (null: allocated before the
    window or outside any module call); None for all when the trace has no module events."""
    if module_spans is None:
        return None
    us = (trace.alloc_t * trace.time_unit_s * 1e6).tolist()
    return [module_spans.top_level_at(t) if seen else None for t, seen in zip(us, trace.alloc_seen.tolist(),
                                                                                strict=True)]


def plan_entries(trace: AllocationTrace, plan: OffsetPlan, swaps: SwapPlan, *,
                 step_boundaries: list[float] | np.ndarray | None = None, period_s: float | None = None,
                 module_spans: ModuleSpans | None = None) -> dict:
    """The plans a program can apply, column-wise and JSON-safe: every allocation's offset in the arena, and
    every swapped allocation's copy schedule. Times are seconds from the trace window's start; `allocation` is
    the index of the allocation in the trace (its order of first appearance). With `step_boundaries` (seconds on
    the trace clock) each swap names its step and whether both copies fall inside it (`within_step`); with
    `module_spans` each allocation names the top-level module that made it (`module`)."""
    modules = _modules(trace, module_spans)
    unit = trace.time_unit_s
    t0 = trace.start_t * unit
    order = np.argsort(swaps.offload_start_s, kind="stable")
    idx = swaps.index[order]
    bounds = None if step_boundaries is None else np.sort(np.asarray(step_boundaries, np.float64))
    step: list[int | None] = [None] * idx.size
    within: list[bool | None] = [None] * idx.size
    if bounds is not None and bounds.size >= 2:
        k = np.searchsorted(bounds, trace.alloc_t[idx] * unit, "right") - 1
        inside = (k >= 0) & (k < bounds.size - 1)
        kk = np.clip(k, 0, bounds.size - 2)
        ok = (swaps.offload_start_s[order] >= bounds[kk]) & (swaps.prefetch_end_s[order] <= bounds[kk + 1])
        step = [int(x) if i else None for x, i in zip(k.tolist(), inside.tolist(), strict=True)]
        within = [bool(o) if i else None for o, i in zip(ok.tolist(), inside.tolist(), strict=True)]
    return {
        "offsets": {
            "algorithm": plan.algorithm,
            "alignment_bytes": plan.alignment,
            "arena_bytes": plan.arena_bytes,
            "lower_bound_bytes": plan.lower_bound_bytes,
            "allocation": list(range(len(trace))),
            "size_bytes": trace.size_bytes.astype(np.int64).tolist(),
            "offset_bytes": np.asarray(plan.offsets, np.int64).tolist(),
            "alloc_seq": trace.alloc_seq.astype(np.int64).tolist(),
            "free_seq": trace.free_seq.astype(np.int64).tolist(),
            "alloc_s": (trace.alloc_t * unit - t0).tolist(),
            "free_s": (trace.free_t * unit - t0).tolist(),
            "module": modules,
        },
        "swap": {
            "candidate_rule": swaps.candidate_rule,
            "step_time_s": swaps.step_time_s,
            "window_s": swaps.window_s,
            "pcie_bandwidth_bytes_per_s": swaps.pcie_bandwidth_bytes_per_s,
            "pcie_bandwidth_source": swaps.pcie_bandwidth_source,
            "old_peak_bytes": swaps.old_peak_bytes,
            "new_peak_bytes": swaps.new_peak_bytes,
            "allocation": idx.tolist(),
            "size_bytes": trace.size_bytes[idx].astype(np.int64).tolist(),
            "alloc_s": (trace.alloc_t[idx] * unit - t0).tolist(),
            "free_s": (trace.free_t[idx] * unit - t0).tolist(),
            "offload_start_s": (swaps.offload_start_s[order] - t0).tolist(),
            "offload_end_s": (swaps.offload_end_s[order] - t0).tolist(),
            "prefetch_start_s": (swaps.prefetch_start_s[order] - t0).tolist(),
            "prefetch_end_s": (swaps.prefetch_end_s[order] - t0).tolist(),
            "module": None if modules is None else [modules[i] for i in idx.tolist()],
            "step_boundaries_s": None if bounds is None else (bounds - t0).tolist(),
            "period_s": period_s,
            "step": step,
            "within_step": within,
        },
        "times_relative_to": "trace window start",
        "source": trace.source,
        "device": trace.device,
    }


def optimization_and_plans(
    trace: AllocationTrace,
    *,
    observed_reserved_bytes: int | None = None,
    pcie_bandwidth_bytes_per_s: float | None = None,
    step_boundaries: list[float] | np.ndarray | None = None,
    period_s: float | None = None,
    gpu_name: str | None = None,
    snapshot: dict | None = None,
    alignment: int = DEFAULT_ALIGNMENT_BYTES,
    module_spans: ModuleSpans | None = None,
    alloc_conf: AllocConfAdvice | None = None,
) -> tuple[dict, dict]:
    """(the report's JSON-safe `optimization` section, the plans' entries (`plan_entries`)).

    `step_boundaries` are seconds on the trace's clock (`alloc_t * time_unit_s`). Byte totals include the
    bytes that stayed live through the window without appearing in it (`untracked_live_bytes`), so they
    compare with the observed reserved peak; `traced_*` fields leave them out. `alloc_conf`: the allocator
    settings compared by simulation, computed by the caller (analysis does not import the estimator).
    """
    reserved = observed_reserved_bytes if observed_reserved_bytes is not None else trace.observed_reserved_bytes
    untracked = trace.untracked_live_bytes or 0
    plan = plan_offsets(trace, alignment=alignment)
    problems = verify_plan(trace, plan, max_conflicts=1)
    if problems:  # plans are checked, never trusted
        raise AssertionError(f"offset plan {plan.algorithm} overlaps live allocations {problems[0]}")
    planned = untracked + plan.arena_bytes
    offset_plan = {
        "allocations": len(trace),
        "algorithm": plan.algorithm,
        "lower_bound_bytes": untracked + plan.lower_bound_bytes,
        "planned_bytes": planned,
        "observed_reserved_bytes": reserved,
        "potential_saving_bytes": max(reserved - planned, 0) if reserved is not None else None,
        "traced_lower_bound_bytes": plan.lower_bound_bytes,
        "traced_planned_bytes": plan.arena_bytes,
        "untracked_live_bytes": trace.untracked_live_bytes,
        "overhead_vs_lower_bound_fraction": plan.overhead_fraction,
        "arena_by_algorithm_bytes": dict(plan.arena_by_algorithm_bytes),
        "alignment_bytes": alignment,
        "elapsed_s": plan.elapsed_s,
        "source": trace.source,
        "device": trace.device,
    }
    swaps = plan_swaps(
        trace,
        pcie_bandwidth_bytes_per_s=pcie_bandwidth_bytes_per_s,
        gpu_name=gpu_name,
        step_boundaries_s=step_boundaries,
        period_s=period_s,
    )
    entries = plan_entries(trace, plan, swaps, step_boundaries=step_boundaries, period_s=period_s,
                           module_spans=module_spans)
    swap = swap_section(swaps, trace)
    for key in ("old_peak_bytes", "new_peak_bytes", "forced_new_peak_bytes"):
        swap[key] += untracked
    section = {
        "offset_plan": offset_plan,
        "swap_plan": swap,
        "fragmentation": fragmentation_findings(
            trace, plan=plan, observed_reserved_bytes=reserved, snapshot=snapshot, alignment=alignment
        ),
        "memory_breakdown": measured_breakdown(trace, reserved, module_spans).model_dump(),
        "allocator_settings": alloc_conf.model_dump() if alloc_conf is not None else None,
        "allocator_recommendation": alloc_conf_recommendation(alloc_conf) if alloc_conf is not None else None,
        "notes": list(trace.notes),
    }
    return section, entries
