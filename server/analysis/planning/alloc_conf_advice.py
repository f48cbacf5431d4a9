"""The allocator-settings recommendation, from the settings compared by simulation (`AllocConfAdvice`).

The comparison itself replays the allocator trace through the caching-allocator simulation (server.estimate
.alloc_conf); analysis must not import the estimator, so the traces service computes it and passes the typed result
in, and this module only words it: the env line to set, the reason, the evidence and the expected saving.
"""

from __future__ import annotations

from typing import Any

from fleetprof.report import AllocConfAdvice
from fleetprof.units import size

KIND = "allocator_settings"


def alloc_conf_recommendation(advice: AllocConfAdvice) -> dict[str, Any] | None:
    """A `Recommendation`-shaped dict; None when the defaults are best (nothing to set)."""
    if advice.env is None:
        return None
    best = advice.best_peak_reserved_bytes
    baseline = advice.baseline_peak_reserved_bytes
    if baseline is None:
        summary = f"Set {advice.env}: the defaults run out of memory in the simulation, this fits in {size(best)}"
        saving = None
    else:
        summary = (f"Set {advice.env}: simulated reserved peak {size(best)} instead of {size(baseline)} "
                   f"({size(advice.saving_bytes)} less, {advice.saving_pct:.1f} %)")
        saving = {"reserved_bytes": advice.saving_bytes, "reserved_pct": advice.saving_pct}
    reason = (f"{len(advice.candidates)} PYTORCH_CUDA_ALLOC_CONF settings were compared by replaying the job's "
              f"allocator trace ({advice.events} events, {advice.device}) through the caching-allocator "
              f"simulation from an empty cache; this one has the lowest reserved peak (no setting can go below the "
              f"{size(advice.peak_allocated_bytes)} allocated at once)")
    if advice.recorded_peak_reserved_bytes is not None:
        reason += f"; the trace itself recorded {size(advice.recorded_peak_reserved_bytes)} reserved"
    notes = [c.note for c in advice.candidates if c.alloc_conf == advice.best_alloc_conf and c.note]
    if notes:
        reason += f"; {notes[0]}"
    evidence = {
        "env": advice.env,
        "alloc_conf": advice.best_alloc_conf,
        "best_peak_reserved_bytes": best,
        "baseline_peak_reserved_bytes": baseline,
        "peak_allocated_bytes": advice.peak_allocated_bytes,
        "recorded_peak_reserved_bytes": advice.recorded_peak_reserved_bytes,
        "capacity_bytes": advice.capacity_bytes,
        "candidates": [c.model_dump() for c in advice.candidates],
        "source": advice.source,
    }
    return {"kind": KIND, "summary": summary, "reason": reason, "evidence": evidence, "saving": saving}
