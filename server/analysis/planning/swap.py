"""Swap (offload/prefetch) plans in the manner of vDNN and AppObMem: move tensors to pinned host memory
while they sit idle, bring them back before they are needed, and hide both copies behind compute.

What the trace can and cannot say. Kineto `[memory]` events and allocator traces record when a block is
allocated and freed, not when a kernel reads it. We take the block to be used at both ends of its life
(written by the op that allocated it, read last by the op after which the caching allocator freed it) and
idle in between. That is exact for the classic swap candidates, forward activations that are written in the
forward pass and read once more in backward before being freed, and optimistic for blocks read in between;
the `approximation` field of the plan says so. Only blocks that live inside one training step are
candidates (given step boundaries; else blocks shorter than the iteration period; else blocks allocated and
freed inside the window): weights and optimizer state are read every step.

Each direction of the PCIe link carries one copy at a time (D2H and H2D run concurrently). Offloads are
scheduled as early as possible in allocation order, prefetches as late as possible in free order; a
candidate is kept when its offload finishes before its prefetch must start, i.e. when the transfers hide.
Candidates that cannot hide but are live at the new peak are reported as forced swaps: how much further
the peak would drop, and the stall that would cost.
The new peak comes from re-sweeping the live bytes with each kept block absent between the end of its
offload and the start of its prefetch. Kept blocks whose absence overlaps no time above the new peak are
dropped again: they cost link time and pinned memory and save nothing at the peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.analysis.base.gpu_catalog import find_model, load_catalog
from server.analysis.traces.alloc_trace import AllocationTrace

MIN_SWAP_BYTES = 1 << 20  # below 1 MiB a copy is all latency and saves nothing worth a plan
COPY_LATENCY_S = 10e-6  # per cudaMemcpyAsync launch + sync overhead, added to every copy
APPROXIMATION = (
    "blocks are taken as used at allocation and at free only (Kineto and allocator traces carry no "
    "reads); idle time between is an upper bound for blocks read in between"
)


@dataclass(frozen=True)
class SwapPlan:
    index: np.ndarray  # int64 allocation ids to swap
    offload_start_s: np.ndarray  # on the trace clock, seconds
    offload_end_s: np.ndarray
    prefetch_start_s: np.ndarray
    prefetch_end_s: np.ndarray
    old_peak_bytes: int
    new_peak_bytes: int
    pinned_host_bytes: int
    pcie_bandwidth_bytes_per_s: float
    pcie_bandwidth_source: str
    candidates: int
    unhidden_candidates: int
    forced_swaps: int  # unhidden candidates live at the new peak, if swapped anyway
    forced_new_peak_bytes: int
    forced_stall_s: float  # per step (per window when no steps are known)
    step_time_s: float | None
    window_s: float  # the trace window; slowdowns are per step where steps are known, else per window
    candidate_rule: str

    @property
    def saved_bytes(self) -> int:
        return self.old_peak_bytes - self.new_peak_bytes

    @property
    def projected_slowdown_fraction(self) -> float | None:
        """Extra time per step (per window without steps) for the forced swaps, which take the peak down
        to `forced_new_peak_bytes`."""
        base = self.step_time_s or self.window_s
        return self.forced_stall_s / base if base > 0 else None


def resolve_pcie_bandwidth(
    pcie_bandwidth_bytes_per_s: float | None, gpu_name: str | None
) -> tuple[float, str]:
    """Explicit value, else the catalogue entry for the GPU, else the slowest link in the catalogue."""
    if pcie_bandwidth_bytes_per_s:
        return float(pcie_bandwidth_bytes_per_s), "configured"
    if gpu_name:
        model = find_model(gpu_name)
        if model is not None:
            return model.pcie_bandwidth_bytes_per_s, f"catalogue:{model.name}"
    slowest = min(load_catalog(), key=lambda m: m.pcie_bandwidth_bytes_per_s)
    return slowest.pcie_bandwidth_bytes_per_s, f"catalogue-slowest:{slowest.name}"


def _peak_with_holes(
    trace: AllocationTrace, hole_idx: np.ndarray, hole_from_s: np.ndarray, hole_to_s: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray]:
    """Peak live bytes on the time axis when block hole_idx[k] is absent in [hole_from_s, hole_to_s).

    Returns (peak, event times, live bytes after each event time) of the holed curve.
    """
    unit = trace.time_unit_s
    sizes = trace.size_bytes
    # Events at one instant keep the trace's event order; a hole opens after and closes before them
    # (the conservative reading when a copy ends exactly at an alloc or free).
    t = np.concatenate([trace.free_t * unit, trace.alloc_t * unit, hole_from_s, hole_to_s])
    d = np.concatenate([-sizes, sizes, -sizes[hole_idx], sizes[hole_idx]])
    m = len(hole_idx)
    seq = np.concatenate([
        trace.free_seq, trace.alloc_seq,
        np.full(m, trace.n_events + 1, np.int64), np.full(m, -2, np.int64),
    ])
    order = np.lexsort((seq, t))
    live = np.cumsum(d[order])
    return int(live.max(initial=0)), t[order], live


def _candidate_mask(
    trace: AllocationTrace,
    step_boundaries_s: np.ndarray | None,
    period_s: float | None,
    min_bytes: int,
) -> tuple[np.ndarray, str]:
    unit = trace.time_unit_s
    inside = trace.alloc_seen & trace.freed & (trace.size_bytes >= min_bytes)
    a_s, f_s = trace.alloc_t * unit, trace.free_t * unit
    if step_boundaries_s is not None and len(step_boundaries_s) >= 2:
        b = np.sort(np.asarray(step_boundaries_s, np.float64))
        same_step = np.searchsorted(b, a_s, "right") == np.searchsorted(b, f_s, "left")
        in_range = (a_s >= b[0]) & (f_s <= b[-1])
        return inside & same_step & in_range, "allocated and freed inside one step (step boundaries)"
    if period_s:
        return inside & (f_s - a_s < period_s), "lifetime shorter than the iteration period"
    return inside, "allocated and freed inside the trace window (no iteration structure given)"


def plan_swaps(
    trace: AllocationTrace,
    *,
    pcie_bandwidth_bytes_per_s: float | None = None,
    gpu_name: str | None = None,
    step_boundaries_s: np.ndarray | list[float] | None = None,
    period_s: float | None = None,
    min_bytes: int = MIN_SWAP_BYTES,
) -> SwapPlan:
    """Choose blocks to offload while idle so the copies hide; times are seconds on the trace's clock
    (`alloc_t * time_unit_s`), and so are `step_boundaries_s`."""
    bw, bw_source = resolve_pcie_bandwidth(pcie_bandwidth_bytes_per_s, gpu_name)
    unit = trace.time_unit_s
    bounds = None if step_boundaries_s is None else np.asarray(step_boundaries_s, np.float64)
    mask, rule = _candidate_mask(trace, bounds, period_s, min_bytes)
    cand = np.flatnonzero(mask)
    sizes = trace.size_bytes
    a_s, f_s = trace.alloc_t * unit, trace.free_t * unit
    copy_s = sizes[cand] / bw + COPY_LATENCY_S

    # D2H: as early as possible, in allocation order, one copy at a time
    off_start = np.empty(len(cand))
    off_end = np.empty(len(cand))
    link = -np.inf
    for k in np.argsort(a_s[cand], kind="stable").tolist():
        start = max(a_s[cand[k]], link)
        off_start[k] = start
        off_end[k] = start + copy_s[k]
        if off_end[k] < f_s[cand[k]]:  # a copy that cannot even finish before the free is not issued
            link = off_end[k]
    # H2D: as late as possible, in reverse free order, one copy at a time
    pre_start = np.empty(len(cand))
    pre_end = np.empty(len(cand))
    link = np.inf
    for k in np.argsort(-f_s[cand], kind="stable").tolist():
        end = min(f_s[cand[k]], link)
        pre_end[k] = end
        pre_start[k] = end - copy_s[k]
        if pre_start[k] > off_end[k]:
            link = pre_start[k]
    hidden = pre_start > off_end

    old_peak, old_t, old_live = _peak_with_holes(trace, cand[:0], np.zeros(0), np.zeros(0))
    keep = np.flatnonzero(hidden)
    new_peak, _, _ = _peak_with_holes(trace, cand[keep], off_end[keep], pre_start[keep])
    # drop swaps whose absence never overlaps a time where the unswapped curve is above the new peak
    above = old_live > new_peak
    if keep.size:
        # live after event j holds on [old_t[j], old_t[j+1]); mark the intervals above the new peak
        hot_from = old_t[:-1][above[:-1]]
        hot_to = old_t[1:][above[:-1]]
        useful = np.zeros(keep.size, bool)
        if hot_from.size:
            # does [off_end, pre_start) meet any hot interval? first hot interval ending after off_end
            j = np.searchsorted(hot_to, off_end[keep], "right")
            ok = j < hot_from.size
            useful[ok] = hot_from[j[ok]] < pre_start[keep][ok]
        keep = keep[useful]
        new_peak, _, _ = _peak_with_holes(trace, cand[keep], off_end[keep], pre_start[keep])

    # pinned host memory: host copies exist from offload start to prefetch end
    idx = cand[keep]
    if keep.size:
        t = np.concatenate([off_start[keep], pre_end[keep]])
        d = np.concatenate([sizes[idx], -sizes[idx]])
        pinned = int(np.cumsum(d[np.lexsort((d, t))]).max())
    else:
        pinned = 0
    # Forced swaps: the candidates whose copies do not hide that are live at the new peak. Swapping them
    # too lowers the peak further, and compute waits for the copy time their idle window cannot cover (a
    # lower bound on the stall: it ignores the link time they would take from the others).
    _, t_new, live_new = _peak_with_holes(trace, idx, off_end[keep], pre_start[keep])
    t_peak = t_new[int(np.argmax(live_new))] if live_new.size else 0.0
    unhidden = ~hidden
    forced = np.flatnonzero(unhidden & (a_s[cand] <= t_peak) & (f_s[cand] > t_peak))
    stall = np.maximum(0.0, 2 * copy_s[forced] - (f_s[cand[forced]] - a_s[cand[forced]]))
    holes = np.concatenate([keep, forced])
    forced_peak, _, _ = _peak_with_holes(
        trace, cand[holes], np.concatenate([off_end[keep], a_s[cand[forced]]]),
        np.concatenate([pre_start[keep], f_s[cand[forced]]]),
    )
    step_time = None
    n_steps = 1
    window_s = (trace.end_t - trace.start_t) * unit
    if bounds is not None and len(bounds) >= 2:
        step_time = float(np.median(np.diff(np.sort(bounds))))
        n_steps = len(bounds) - 1
    elif period_s:
        step_time = float(period_s)
        n_steps = max(1, round(window_s / period_s))
    return SwapPlan(
        index=idx.astype(np.int64),
        offload_start_s=off_start[keep],
        offload_end_s=off_end[keep],
        prefetch_start_s=pre_start[keep],
        prefetch_end_s=pre_end[keep],
        old_peak_bytes=old_peak,
        new_peak_bytes=new_peak,
        pinned_host_bytes=pinned,
        pcie_bandwidth_bytes_per_s=bw,
        pcie_bandwidth_source=bw_source,
        candidates=int(cand.size),
        unhidden_candidates=int(unhidden.sum()),
        forced_swaps=int(forced.size),
        forced_new_peak_bytes=forced_peak,
        forced_stall_s=float(stall.sum()) / n_steps,
        step_time_s=step_time,
        window_s=window_s,
        candidate_rule=rule,
    )


def swap_section(plan: SwapPlan, trace: AllocationTrace, *, max_tensors: int = 50) -> dict:
    """JSON-safe summary: totals and the largest swapped tensors with their schedule."""
    order = np.argsort(-trace.size_bytes[plan.index], kind="stable")[:max_tensors]
    t0 = trace.start_t * trace.time_unit_s
    tensors = [
        {
            "allocation": int(plan.index[k]),
            "size_bytes": int(trace.size_bytes[plan.index[k]]),
            "idle_window_s": float(
                (trace.free_t[plan.index[k]] - trace.alloc_t[plan.index[k]]) * trace.time_unit_s
            ),
            "offload_start_s": float(plan.offload_start_s[k] - t0),
            "offload_end_s": float(plan.offload_end_s[k] - t0),
            "prefetch_start_s": float(plan.prefetch_start_s[k] - t0),
            "prefetch_end_s": float(plan.prefetch_end_s[k] - t0),
        }
        for k in order.tolist()
    ]
    slowdown = plan.projected_slowdown_fraction
    return {
        "tensors_swapped": int(plan.index.size),
        "candidates": plan.candidates,
        "candidate_rule": plan.candidate_rule,
        "old_peak_bytes": plan.old_peak_bytes,
        "new_peak_bytes": plan.new_peak_bytes,
        "saved_bytes": plan.saved_bytes,
        "pinned_host_bytes": plan.pinned_host_bytes,
        "pcie_bandwidth_bytes_per_s": plan.pcie_bandwidth_bytes_per_s,
        "pcie_bandwidth_source": plan.pcie_bandwidth_source,
        "unhidden_candidates": plan.unhidden_candidates,
        "forced_swaps": plan.forced_swaps,
        "forced_new_peak_bytes": plan.forced_new_peak_bytes,
        "forced_stall_per_step_s": plan.forced_stall_s,
        "step_time_s": plan.step_time_s,
        "window_s": plan.window_s,
        "projected_slowdown_fraction": slowdown,
        "approximation": APPROXIMATION,
        "times_relative_to": "trace window start",
        "tensors": tensors,
    }
