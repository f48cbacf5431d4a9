"""Fragmentation findings: where reserved memory went that no tensor used, and what would have got it back.

Three kinds of waste (vDNN++, Shriram et al. 2019, compares allocation heuristics on the same ground):
- internal: the caching allocator rounds every request up to 512 bytes (and hands out whole blocks it
  chose not to split); measurable only where requested sizes are known (estimator traces, snapshots);
  Kineto `[memory]` events already carry rounded sizes;
- external: reserved − allocated at the peak: free bytes held in cached segments, some of them in
  segments that also hold live blocks (inactive splits), which `empty_cache` cannot return;
- order: the same allocations placed by a planner that knows every lifetime need only the planned arena.

Counterfactuals, with numbers:
- `expandable_segments:True` lets the allocator grow one address range per stream instead of carving
  fixed segments, which removes most external waste. We estimate its footprint by replaying the trace
  through online best-fit in one growing address space (no knowledge of the future), rounded up to the
  2 MiB pages it maps;
- a planned allocation order: the offset plan's arena (`packing.plan_offsets`).
Both are added to the bytes that stayed live through the window without appearing in the trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fleetprof.units import size
from server.analysis.planning.packing import DEFAULT_ALIGNMENT_BYTES, OffsetPlan, aligned_sizes, best_fit
from server.analysis.traces.alloc_trace import AllocationTrace, live_bytes_curve

EXPANDABLE_PAGE_BYTES = 2 << 20  # expandable segments map physical memory in 2 MiB pages
MIN_FINDING_BYTES = 1 << 20  # savings under 1 MiB are not worth a line in a report


def summarize_snapshot(snapshot: Mapping[str, Any]) -> dict[str, int]:
    """Totals from a PyTorch memory snapshot (`torch.cuda.memory._snapshot()` converted to JSON) or an
    already summarised dict with the same keys, passed through."""
    if "segments" not in snapshot:
        return {k: int(v) for k, v in snapshot.items() if isinstance(v, (int, float)) and v is not None}
    reserved = allocated = requested = inactive = inactive_split = largest_inactive = 0
    have_requested = True
    for seg in snapshot["segments"]:
        reserved += int(seg.get("total_size", 0))
        blocks = seg.get("blocks", [])
        seg_active = any(b.get("state", "").startswith("active") for b in blocks)
        for b in blocks:
            size = int(b.get("size", 0))
            if b.get("state") == "active_allocated":
                allocated += size
                if "requested_size" in b:
                    requested += int(b["requested_size"])
                else:
                    have_requested = False
            elif b.get("state") == "inactive":
                inactive += size
                largest_inactive = max(largest_inactive, size)
                if seg_active:
                    inactive_split += size
    out = {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "inactive_bytes": inactive,
        "inactive_split_bytes": inactive_split,
        "largest_inactive_block_bytes": largest_inactive,
        "segments": len(snapshot["segments"]),
    }
    if have_requested and allocated:
        out["requested_bytes"] = requested
    return out


def online_best_fit_bytes(trace: AllocationTrace, alignment: int = DEFAULT_ALIGNMENT_BYTES) -> int:
    """Arena of online best fit in one growing address space: the `expandable_segments` estimate."""
    units = aligned_sizes(trace, alignment) // alignment
    _, top = best_fit(units, trace.alloc_seq, trace.free_seq, lookahead=False)
    return int(top) * alignment


def _internal_waste_at_peak(trace: AllocationTrace, alignment: int) -> tuple[int, int] | None:
    """(rounding waste, requested bytes) over the blocks live at the peak, where requests are known."""
    requested = trace.requested_size_bytes
    if requested is None:
        if np.all(trace.size_bytes % alignment == 0):
            return None  # rounded sizes only: the request is gone
        requested = trace.size_bytes
    rounded = np.maximum(aligned_sizes(trace, alignment), alignment)
    seq, live = live_bytes_curve(trace, rounded)
    if live.size == 0:
        return None
    peak_at = seq[int(np.argmax(live))]
    at_peak = (trace.alloc_seq <= peak_at) & (trace.free_seq > peak_at)
    return int((rounded - requested)[at_peak].sum()), int(requested[at_peak].sum())


def fragmentation_findings(
    trace: AllocationTrace | None,
    *,
    plan: OffsetPlan | None = None,
    observed_reserved_bytes: int | None = None,
    observed_allocated_bytes: int | None = None,
    snapshot: Mapping[str, Any] | None = None,
    alignment: int = DEFAULT_ALIGNMENT_BYTES,
) -> list[dict[str, Any]]:
    """Findings `{kind, summary, reason, saving_bytes}`; saving_bytes is None where it cannot be known."""
    findings: list[dict[str, Any]] = []
    snap = summarize_snapshot(snapshot) if snapshot is not None else {}
    reserved = observed_reserved_bytes
    allocated = observed_allocated_bytes
    if trace is not None:
        reserved = reserved if reserved is not None else trace.observed_reserved_bytes
        allocated = allocated if allocated is not None else trace.observed_allocated_bytes
    reserved = reserved if reserved is not None else snap.get("reserved_bytes")
    allocated = allocated if allocated is not None else snap.get("allocated_bytes")
    untracked = (trace.untracked_live_bytes or 0) if trace is not None else 0

    # internal: rounding
    internal = _internal_waste_at_peak(trace, alignment) if trace is not None else None
    if internal is None and "requested_bytes" in snap:
        internal = (snap["allocated_bytes"] - snap["requested_bytes"], snap["requested_bytes"])
    if internal is not None:
        waste, req = internal
        findings.append({
            "kind": "internal_rounding",
            "summary": f"{size(waste)} lost to allocator rounding at the peak",
            "reason": f"{size(req)} requested, rounded up to {alignment}-byte multiples and unsplit blocks",
            "saving_bytes": None,  # inherent to the allocator; reported, not recoverable by a setting
            "waste_bytes": waste,
        })
    elif trace is not None:
        findings.append({
            "kind": "internal_rounding",
            "summary": "rounding waste unknown",
            "reason": "the trace records sizes after the allocator rounded them; requested sizes need a snapshot",
            "saving_bytes": None,
            "waste_bytes": None,
        })

    # external: reserved − allocated
    if reserved is not None and allocated is not None and reserved > allocated:
        ext = reserved - allocated
        reason = "free bytes held in cached segments at the reserved peak"
        if "inactive_split_bytes" in snap:
            reason += (
                f"; {size(snap['inactive_split_bytes'])} sit in segments that also hold live blocks"
                " (inactive splits), which empty_cache() cannot return"
            )
        findings.append({
            "kind": "external_fragmentation",
            "summary": f"{size(ext)} reserved but not allocated ({ext / reserved:.0%} of reserved)",
            "reason": reason,
            "saving_bytes": ext,
            "waste_bytes": ext,
        })

    if trace is not None and len(trace) and reserved is not None:
        pages = -(-online_best_fit_bytes(trace, alignment) // EXPANDABLE_PAGE_BYTES)  # rounded up
        expandable = untracked + pages * EXPANDABLE_PAGE_BYTES
        saving = reserved - expandable
        findings.append({
            "kind": "expandable_segments",
            "summary": (
                f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would need about {size(expandable)}"
                + (f", {size(saving)} less than reserved" if saving > 0 else ", no less than reserved")
            ),
            "reason": "online best fit replayed in one growing address space, in 2 MiB pages, "
            "plus the bytes live through the whole window",
            "saving_bytes": max(saving, 0) if saving >= MIN_FINDING_BYTES else 0,
            "estimated_reserved_bytes": expandable,
        })
    if plan is not None and reserved is not None:
        planned = untracked + plan.arena_bytes
        saving = reserved - planned
        findings.append({
            "kind": "allocation_order",
            "summary": (
                f"a planned allocation order ({plan.algorithm}) fits the traced allocations in "
                f"{size(planned)}" + (f", {size(saving)} below reserved" if saving > 0 else "")
            ),
            "reason": f"offset plan arena {size(plan.arena_bytes)} vs lower bound {size(plan.lower_bound_bytes)} "
            f"(+{plan.overhead_fraction:.1%}), plus {size(untracked)} live through the window",
            "saving_bytes": max(saving, 0),
            "planned_bytes": planned,
        })
    return findings
