"""Report sections that come from uploaded artefacts: Kineto time breakdown per rank, allocator peaks from
`[memory]` events, offset/swap plans and fragmentation from allocation traces and snapshots.

Pure: takes the stored per-upload summaries (dicts) and the report built from telemetry, returns the report
with these sections merged, each figure naming its source.
"""

from __future__ import annotations

from typing import Any

from server.analysis.kineto import combine_ranks


def _largest_plan(traces: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    planned = [t for t in traces if isinstance(t.get("optimization"), dict)]
    if not planned:
        return None
    best = max(planned, key=lambda t: (t["optimization"].get("offset_plan") or {}).get("lower_bound_bytes") or 0)
    return best, best["optimization"]


def merge_trace_sections(report: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    """`traces`: stored summaries, each with `kind` ("kineto" | "snapshot"), `filename`, `rank`."""
    sources: dict[str, str] = report.setdefault("sources", {})
    kineto = [t for t in traces if t.get("kind") == "kineto"]
    snapshots = [t for t in traces if t.get("kind") == "snapshot"]
    report["traces"] = {"kineto_files": len(kineto), "snapshot_files": len(snapshots)}
    if kineto:
        try:
            combined = combine_ranks(kineto)
        except ValueError as exc:
            combined = {"error": str(exc)}
        report["traces"]["kineto"] = combined
        totals = combined.get("totals") or {}
        time = report.setdefault("time", {})
        time["breakdown"] = {k: totals.get(k) for k in ("idle_pct", "compute_pct", "non_compute_pct", "span_us",
                                                        "communication_us")} if totals else None
        sources["time.breakdown"] = "kineto (HTA-compatible temporal breakdown)"
        memory = report.setdefault("memory", {})
        for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
            if memory.get(key) is None and totals.get(key) is not None:
                memory[key] = totals[key]
                sources[f"memory.{key}"] = "kineto [memory] events"
        if memory.get("fragmentation_bytes") is None and memory.get("peak_reserved_bytes") is not None \
                and memory.get("peak_allocated_bytes") is not None:
            memory["fragmentation_bytes"] = memory["peak_reserved_bytes"] - memory["peak_allocated_bytes"]
            sources["memory.fragmentation_bytes"] = "kineto [memory] events (peak reserved - peak allocated)"
    if snapshots:
        latest = snapshots[-1]
        report["traces"]["snapshot"] = {k: v for k, v in latest.items() if k not in ("optimization",)}
    plan = _largest_plan(traces)
    if plan is not None:
        trace, section = plan
        report["optimization"] = {**section, "source": f"{trace.get('kind')}:{trace.get('filename')}"}
        sources["optimization"] = f"allocation trace from {trace.get('kind')} upload {trace.get('filename')!r}"
        computed = section.get("allocator_recommendation")  # allocator settings compared by simulation
        if computed:
            recs = [r for r in report.get("recommendations") or [] if r.get("kind") != computed["kind"]]
            report["recommendations"] = [*recs, computed]
    else:
        report["optimization"] = None
    return report
