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
from server.analysis.planning.packing import DEFAULT_ALIGNMENT_BYTES, plan_offsets, verify_plan
from server.analysis.planning.swap import plan_swaps, swap_section
from server.analysis.traces.alloc_trace import AllocationTrace
from server.analysis.traces.memory_breakdown import measured_breakdown
from server.analysis.traces.module_spans import ModuleSpans


def optimization_section(
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
) -> dict:
    """The report's JSON-safe `optimization` section: offset plan, swap plan, fragmentation findings.

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
    swap = swap_section(swaps, trace)
    for key in ("old_peak_bytes", "new_peak_bytes", "forced_new_peak_bytes"):
        swap[key] += untracked
    return {
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
