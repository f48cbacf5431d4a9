"""Offset planning: give every traced allocation an offset in one arena so that no two allocations live at
the same time share a byte, with the arena as small as we can make it.

Each allocation is a rectangle: its lifetime `[alloc_seq, free_seq)` on the x axis (fixed), its size on the
y axis; an offset plan is a packing of those rectangles into a strip of least height (Sekiyama et al. 2018,
"Profile-guided memory optimization for deep neural networks"). The height can never be below the most
bytes live at once (`max_live_bytes`), the lower bound every report sets the plan against.

Three heuristics, the smallest arena wins:
- `best_fit`: sweep the allocations in time order; each takes the smallest free gap that holds it (the
  best-fit rule of the paper's packing heuristic), placed against the neighbour that is freed closest to
  its own free time so holes coalesce, else the top of the arena. O(n log n) with sorted free lists.
- `skyline`: the paper's best-fit for the strip: fill the lowest skyline gap with the longest-lived block
  that fits inside it, raise the gap when none does. Scans candidates with numpy; skipped above
  `skyline_max_allocations` where its scans stop paying.
- `best_fit_online`: the same sweep without lookahead (gap's low end), which is also what an allocator
  growing one address space would do; sometimes tighter, so it is tried too.
- `greedy_by_size` (Pisarchyk & Lee 2020): largest first, each into the smallest gap left between the
  already placed blocks that overlap it in time. Quadratic in the worst case (numpy inner loop); skipped
  above `greedy_max_allocations`.

All work is in units of `alignment` bytes (sizes rounded up), so keys stay small integers.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left, insort
from dataclasses import dataclass, field

import numpy as np

from server.analysis.traces.alloc_trace import AllocationTrace, max_live_bytes

DEFAULT_ALIGNMENT_BYTES = 512  # the CUDA caching allocator's rounding
_SHIFT = 32  # free-list key = size_units << _SHIFT | offset_units


@dataclass(frozen=True)
class OffsetPlan:
    offsets: np.ndarray  # int64 bytes, one per allocation of the trace
    arena_bytes: int
    lower_bound_bytes: int  # max live bytes of the aligned sizes
    algorithm: str
    elapsed_s: float
    alignment: int = DEFAULT_ALIGNMENT_BYTES
    arena_by_algorithm_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def overhead_fraction(self) -> float:
        return self.arena_bytes / self.lower_bound_bytes - 1.0 if self.lower_bound_bytes else 0.0


def aligned_sizes(trace: AllocationTrace, alignment: int = DEFAULT_ALIGNMENT_BYTES) -> np.ndarray:
    return -(-trace.size_bytes // alignment) * alignment


def _event_order(alloc_seq: np.ndarray, free_seq: np.ndarray) -> np.ndarray:
    """Event ids in sweep order: i >= 0 allocates block i, ~i frees it; frees first at equal positions,
    and among blocks allocated at one position (before the window) the longest-lived goes first."""
    n = len(alloc_seq)
    ids = np.concatenate([~np.arange(n), np.arange(n)])
    pos = np.concatenate([free_seq, alloc_seq])
    kind = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8)])
    tie = np.concatenate([np.zeros(n, np.int64), -free_seq])
    return ids[np.lexsort((tie, kind, pos))]


def best_fit(
    units: np.ndarray, alloc_seq: np.ndarray, free_seq: np.ndarray, *, lookahead: bool = True
) -> tuple[np.ndarray, int]:
    """Best fit in allocation order. `lookahead=False` is the online rule an allocator with one growing
    address space follows (no knowledge of free times): what `expandable_segments` approaches."""
    n = len(units)
    offsets = [0] * n
    size_l = units.tolist()
    free_l = free_seq.tolist()
    by_size: list[int] = []  # keys size << SHIFT | start
    gap_end: dict[int, int] = {}  # start -> end
    gap_start: dict[int, int] = {}  # end -> start
    owner_at_start: dict[int, int] = {}  # offset where a live block begins -> block
    owner_at_end: dict[int, int] = {}  # offset where a live block ends -> block
    top = 0
    mask = (1 << _SHIFT) - 1

    def drop_gap(start: int, end: int) -> None:
        key = ((end - start) << _SHIFT) | start
        del by_size[bisect_left(by_size, key)]
        del gap_end[start]
        del gap_start[end]

    def add_gap(start: int, end: int) -> None:
        insort(by_size, ((end - start) << _SHIFT) | start)
        gap_end[start] = end
        gap_start[end] = start

    for ev in _event_order(alloc_seq, free_seq).tolist():
        if ev >= 0:
            sz = size_l[ev]
            if sz == 0:
                offsets[ev] = 0
                continue
            k = bisect_left(by_size, sz << _SHIFT)
            if k < len(by_size):
                key = by_size[k]
                gstart = key & mask
                gend = gstart + (key >> _SHIFT)
                drop_gap(gstart, gend)
                off = gstart
                if gend - gstart > sz:
                    # With lookahead, sit against the neighbour freed closest to our own free time: when
                    # both go, the holes merge instead of leaving a sliver.
                    above_closer = False
                    if lookahead:
                        below = owner_at_end.get(gstart)
                        above = owner_at_start.get(gend)
                        mine = free_l[ev]
                        if above is not None:
                            above_closer = below is None or abs(free_l[above] - mine) < abs(free_l[below] - mine)
                    if above_closer:
                        off = gend - sz
                        add_gap(gstart, off)
                    else:
                        add_gap(off + sz, gend)
            else:
                gtop = gap_start.get(top)
                if gtop is not None:
                    drop_gap(gtop, top)
                    off = gtop
                else:
                    off = top
                top = max(top, off + sz)
            offsets[ev] = off
            owner_at_start[off] = ev
            owner_at_end[off + sz] = ev
        else:
            b = ~ev
            sz = size_l[b]
            if sz == 0:
                continue
            start = offsets[b]
            end = start + sz
            if owner_at_start.get(start) == b:
                del owner_at_start[start]
            if owner_at_end.get(end) == b:
                del owner_at_end[end]
            s2 = gap_start.get(start)
            if s2 is not None:
                drop_gap(s2, start)
                start = s2
            e2 = gap_end.get(end)
            if e2 is not None:
                drop_gap(end, e2)
                end = e2
            add_gap(start, end)
    return np.asarray(offsets, np.int64), top


def _greedy_by_size(units: np.ndarray, alloc_seq: np.ndarray, free_seq: np.ndarray) -> tuple[np.ndarray, int]:
    n = len(units)
    order = np.lexsort((alloc_seq, -(free_seq - alloc_seq), -units))
    p_s = np.empty(n, np.int64)
    p_e = np.empty(n, np.int64)
    p_lo = np.empty(n, np.int64)
    p_hi = np.empty(n, np.int64)
    offsets = np.zeros(n, np.int64)
    k = 0
    top = 0
    for i in order.tolist():
        s, e, sz = alloc_seq[i], free_seq[i], units[i]
        if sz == 0:
            continue
        hit = (p_s[:k] < e) & (p_e[:k] > s)
        off = 0
        if hit.any():
            lo = p_lo[:k][hit]
            hi = p_hi[:k][hit]
            idx = np.argsort(lo, kind="stable")
            lo = lo[idx]
            reach = np.maximum.accumulate(hi[idx])
            # gap j lies between the occupied reach of blocks[:j] and the start of block j
            gap_lo = np.concatenate(([0], reach[:-1]))
            gap = lo - gap_lo
            fits = np.flatnonzero(gap >= sz)
            if fits.size:
                j = fits[np.argmin(gap[fits])]
                off = int(gap_lo[j])
            else:
                off = int(reach[-1])
        offsets[i] = off
        p_s[k], p_e[k], p_lo[k], p_hi[k] = s, e, off, off + sz
        k += 1
        top = max(top, off + int(sz))
    return offsets, top


def _skyline(units: np.ndarray, alloc_seq: np.ndarray, free_seq: np.ndarray) -> tuple[np.ndarray, int]:
    n = len(units)
    offsets = [0] * n
    live = np.flatnonzero(units > 0)
    if live.size == 0:
        return np.zeros(n, np.int64), 0
    order = live[np.argsort(alloc_seq[live], kind="stable")]
    # candidates sorted by start; numpy copies for wide gaps, lists for the many narrow ones
    cs = alloc_seq[order]
    ce = free_seq[order]
    # best fit = the longest lifetime inside the gap, then the larger block
    prio = (ce - cs).astype(np.float64) * 2.0**40 + units[order].astype(np.float64)
    cid = order
    done = np.zeros(len(order), bool)
    cs_l, ce_l, prio_l, cid_l = cs.tolist(), ce.tolist(), prio.tolist(), cid.tolist()
    done_l = [False] * len(order)
    units_l = units.tolist()
    remaining = len(order)
    x0, x1 = int(cs[0]), int(ce.max())
    seg_end: dict[int, int] = {x0: x1}  # skyline segment start -> end
    seg_h: dict[int, int] = {x0: 0}  # start -> height
    seg_start: dict[int, int] = {x1: x0}  # end -> start
    heap: list[tuple[int, int]] = [(0, x0)]  # (height, start): lowest, then leftmost
    top = 0
    while remaining:
        h, a = heapq.heappop(heap)
        if seg_h.get(a) != h:
            continue  # stale entry
        b = seg_end[a]
        lo = bisect_left(cs_l, a)
        hi = bisect_left(cs_l, b, lo)
        best = -1
        if hi - lo > 128:
            ok = (ce[lo:hi] <= b) & ~done[lo:hi]
            cand = np.flatnonzero(ok)
            if cand.size:
                best = lo + int(cand[np.argmax(prio[lo:hi][cand])])
        elif hi > lo:
            best_p = -1.0
            for j in range(lo, hi):
                if ce_l[j] <= b and not done_l[j] and prio_l[j] > best_p:
                    best, best_p = j, prio_l[j]
        if best >= 0:
            done[best] = done_l[best] = True
            remaining -= 1
            i = cid_l[best]
            offsets[i] = h
            s_, e_ = cs_l[best], ce_l[best]
            top = max(top, h + units_l[i])
            # split [a,b) into [a,s) at h, [s,e) at h+size, [e,b) at h
            del seg_end[a], seg_h[a], seg_start[b]
            for ps, pe, ph in ((a, s_, h), (s_, e_, h + units_l[i]), (e_, b, h)):
                if pe > ps:
                    seg_end[ps] = pe
                    seg_h[ps] = ph
                    seg_start[pe] = ps
                    heapq.heappush(heap, (ph, ps))
            if remaining * 2 < len(cs_l) and len(cs_l) > 1024:
                keep = ~done
                cs, ce, prio, cid = cs[keep], ce[keep], prio[keep], cid[keep]
                done = np.zeros(len(cs), bool)
                cs_l, ce_l, prio_l, cid_l = cs.tolist(), ce.tolist(), prio.tolist(), cid.tolist()
                done_l = [False] * len(cs_l)
            continue
        # nothing fits: raise the gap to its lower neighbour and merge with the neighbours at that height
        left = seg_start.get(a)
        hl = seg_h[left] if left is not None else None
        hr = seg_h.get(b)
        if hl is None and hr is None:
            break  # unreachable while blocks remain: one segment spans every lifetime
        new_h = min(h for h in (hl, hr) if h is not None)
        ns, ne = a, b
        del seg_end[a], seg_h[a], seg_start[b]
        if hl == new_h and left is not None:  # hl is known only with a left neighbour
            ns = left
            del seg_end[left], seg_h[left], seg_start[a]
        if hr == new_h:
            ne = seg_end[b]
            del seg_end[b], seg_h[b], seg_start[ne]
        seg_end[ns] = ne
        seg_h[ns] = new_h
        seg_start[ne] = ns
        heapq.heappush(heap, (new_h, ns))
    return np.asarray(offsets, np.int64), top


def _best_fit_online(units: np.ndarray, alloc_seq: np.ndarray, free_seq: np.ndarray) -> tuple[np.ndarray, int]:
    return best_fit(units, alloc_seq, free_seq, lookahead=False)


ALGORITHMS = {
    "best_fit": best_fit,
    "skyline": _skyline,
    "greedy_by_size": _greedy_by_size,
    "best_fit_online": _best_fit_online,
}


def plan_offsets(
    trace: AllocationTrace,
    *,
    alignment: int = DEFAULT_ALIGNMENT_BYTES,
    algorithms: tuple[str, ...] = ("best_fit", "skyline", "greedy_by_size", "best_fit_online"),
    skyline_max_allocations: int = 50_000,
    greedy_max_allocations: int = 30_000,
) -> OffsetPlan:
    """Plan offsets with each heuristic that fits the trace size and keep the smallest arena."""
    t0 = time.perf_counter()
    sizes = aligned_sizes(trace, alignment)
    units = sizes // alignment
    lower = max_live_bytes(trace, sizes)
    limits = {"skyline": skyline_max_allocations, "greedy_by_size": greedy_max_allocations}
    best: tuple[int, str, np.ndarray] | None = None
    arenas: dict[str, int] = {}
    for name in algorithms:
        if len(trace) > limits.get(name, len(trace)):
            continue
        offs, top_units = ALGORITHMS[name](units, trace.alloc_seq, trace.free_seq)
        arenas[name] = int(top_units) * alignment
        if best is None or arenas[name] < best[0]:
            best = (arenas[name], name, offs)
        if arenas[name] == lower:
            break  # optimal: nothing can beat it
    if best is None:
        raise ValueError("no algorithm ran: every one was skipped for the trace size")
    return OffsetPlan(
        offsets=best[2] * alignment,
        arena_bytes=best[0],
        lower_bound_bytes=lower,
        algorithm=best[1],
        elapsed_s=time.perf_counter() - t0,
        alignment=alignment,
        arena_by_algorithm_bytes=arenas,
    )


def verify_plan(trace: AllocationTrace, plan: OffsetPlan, *, max_conflicts: int = 10) -> list[tuple[int, int]]:
    """Pairs (i, j) of allocations live at the same time that share a byte; (i, -1) for a block outside
    the arena. Empty = the plan is valid. A sweep over events with the live blocks kept sorted by offset:
    while they are disjoint, a new block can only collide with its two neighbours."""
    sizes = aligned_sizes(trace, plan.alignment)
    offs = np.asarray(plan.offsets, np.int64)
    conflicts: list[tuple[int, int]] = []
    if offs.shape != sizes.shape:
        return [(-1, -1)]
    outside = np.flatnonzero((sizes > 0) & ((offs < 0) | (offs + sizes > plan.arena_bytes)))
    conflicts.extend((int(i), -1) for i in outside[:max_conflicts])
    off_l = offs.tolist()
    end_l = (offs + sizes).tolist()
    size_l = sizes.tolist()
    live_starts: list[int] = []
    live_ids: list[int] = []
    left_out: set[int] = set()
    for ev in _event_order(trace.alloc_seq, trace.free_seq).tolist():
        if len(conflicts) >= max_conflicts:
            break
        if ev < 0:
            b = ~ev
            if size_l[b] == 0 or b in left_out:
                continue
            # live blocks are disjoint, so their starts are unique
            k = bisect_left(live_starts, off_l[b])
            del live_starts[k], live_ids[k]
            continue
        if size_l[ev] == 0:
            continue
        start, end = off_l[ev], end_l[ev]
        k = bisect_left(live_starts, start)
        bad = False
        if k > 0 and end_l[live_ids[k - 1]] > start:
            conflicts.append((live_ids[k - 1], ev))
            bad = True
        if k < len(live_starts) and live_starts[k] < end:
            conflicts.append((live_ids[k], ev))
            bad = True
        if bad:
            left_out.add(ev)
        else:
            live_starts.insert(k, start)
            live_ids.insert(k, ev)
        # a conflicting block is left out of the live set so one error does not cascade into many
    return conflicts[:max_conflicts]

