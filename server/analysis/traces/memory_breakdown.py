"""Measured device memory at the peak, by what holds it, from one allocation trace (issue #17 item 5).

An allocator trace says when each block lived, not what tensor it held: Kineto `[memory]` events carry no module
or tensor role. So at the peak of live bytes the split is what the trace can support: blocks live since before
the window (weights, gradients and optimizer state together), blocks allocated in the window and still live
(activations and temporaries together; split by the top-level module that allocated them where the trace holds
module calls), rounding where the source gives requested sizes (snapshots), and the cached-free bytes against the
allocator's own `Total Reserved`. The rest is None, with the reason.
"""

from __future__ import annotations

import numpy as np

from fleetprof.report import BreakdownPart, MemoryBreakdown, ModuleActivations
from server.analysis.traces.alloc_trace import AllocationTrace, live_bytes_curve
from server.analysis.traces.module_spans import ModuleSpans

_ROUNDING_KNOWN = "block - requested sizes (snapshot); inside the parts above, not added again"
_NO_ORIGIN = "unknown: the allocation trace carries no tensor origin"


OUTSIDE_MODULES = "(outside modules)"


def measured_breakdown(trace: AllocationTrace, observed_reserved_bytes: int | None = None,
                       modules: ModuleSpans | None = None) -> MemoryBreakdown:
    """`modules`: the trace's module calls (a Kineto trace recorded with stacks) to split the window's
    allocations by the top-level module that made them."""
    reserved = observed_reserved_bytes if observed_reserved_bytes is not None else trace.observed_reserved_bytes
    alloc_seq, free_seq, sizes = trace.alloc_seq, trace.free_seq, trace.size_bytes.astype(np.int64)
    seq, live_curve = live_bytes_curve(trace)
    at = int(seq[int(np.argmax(live_curve))]) if len(live_curve) else -1
    best_live = (alloc_seq <= at) & (free_seq > at)
    untracked = trace.untracked_live_bytes
    before = int(sizes[best_live & (alloc_seq < 0)].sum())
    in_window = int(sizes[best_live & (alloc_seq >= 0)].sum())
    persistent = None if untracked is None else untracked + before
    rounding = None
    if trace.requested_size_bytes is not None:
        rounding = int((sizes[best_live] - trace.requested_size_bytes[best_live].astype(np.int64)).sum())
    allocated = (untracked or 0) + before + in_window
    cached = reserved - allocated if reserved is not None and untracked is not None else None
    src = f"allocation trace ({trace.source}), blocks live at the peak of live bytes"
    by_module: dict[str, int] = {}
    if modules is not None:
        for i in np.flatnonzero(best_live & (alloc_seq >= 0)):
            name = modules.top_level_at(float(trace.alloc_t[i])) or OUTSIDE_MODULES
            by_module[name] = by_module.get(name, 0) + int(sizes[i])
    parts = [persistent, in_window, cached]
    unknown = BreakdownPart(bytes=None, source=_NO_ORIGIN)
    return MemoryBreakdown(
        at="peak of live bytes in the traced window",
        weights=unknown, gradients=unknown, optimizer_state=unknown, activations=unknown,
        activations_by_module=[], inputs=unknown, temporaries_and_workspaces=unknown,
        step_allocations=BreakdownPart(bytes=in_window, source=src + ", allocated in the window"),
        step_allocations_by_module=[ModuleActivations(module=m, bytes=v)
                                    for m, v in sorted(by_module.items(), key=lambda kv: -kv[1])],
        persistent_unsplit=BreakdownPart(bytes=persistent, source=src + ", allocated before the window (Total "
                                         "Allocated at its start)" if persistent is not None else "unknown: the "
                                         "trace gives no allocator total"),
        allocator_rounding=BreakdownPart(bytes=rounding, source=_ROUNDING_KNOWN if rounding is not None
                                         else "unknown: Kineto reports rounded block sizes"),
        cached_free=BreakdownPart(bytes=cached, source="recorded Total Reserved - allocated at the peak"
                                  if cached is not None else "unknown: no reserved figure in the trace"),
        cuda_context=BreakdownPart(bytes=None, source="outside the allocator: see memory.non_framework_bytes (NVML)"),
        total_bytes=sum(p for p in parts if p is not None),  # rounding lies inside the block sizes
    )
