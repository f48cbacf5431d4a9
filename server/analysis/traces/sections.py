"""Report sections that come from uploaded artefacts: Kineto time breakdown per rank, allocator peaks from
`[memory]` events, offset/swap plans and fragmentation from allocation traces and snapshots.

Pure: `trace_sections` takes the typed report built from telemetry and the stored per-upload summaries (dicts)
and returns the report with these sections merged, each figure naming its source; `merge_trace_sections` does
the same to the report's stored JSON document.
"""

from __future__ import annotations

from typing import Any

from fleetprof.report import FrameworkSection, JobReport, Recommendation, Sources, TimeBreakdown, TracesSection
from server.analysis.traces.kineto import combine_ranks

BREAKDOWN_KEYS = ("idle_pct", "compute_pct", "non_compute_pct", "span_us", "communication_us")


def breakdown_of(totals: dict[str, Any]) -> TimeBreakdown | None:
    """The time breakdown of combined Kineto totals (server.analysis.traces.kineto.combine_ranks); None without."""
    return TimeBreakdown.model_validate({k: totals.get(k) for k in BREAKDOWN_KEYS}) if totals else None


def kineto_breakdown(kineto: list[dict[str, Any]]) -> TimeBreakdown | None:
    """The breakdown of these ranks' Kineto summaries together; None when there are none or they do not combine."""
    if not kineto:
        return None
    try:
        return breakdown_of(combine_ranks(kineto).get("totals") or {})
    except ValueError:
        return None


def largest_plan(traces: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the upload whose plan the report shows, its `optimization`): the one with the largest lower bound."""
    planned = [t for t in traces if isinstance(t.get("optimization"), dict)]
    if not planned:
        return None
    best = max(planned, key=lambda t: (t["optimization"].get("offset_plan") or {}).get("lower_bound_bytes") or 0)
    return best, best["optimization"]


def trace_sections(report: JobReport, traces: list[dict[str, Any]]) -> JobReport:
    """`traces`: stored summaries, each with `kind` ("kineto" | "snapshot"), `filename`, `rank`."""
    sources: dict[str, Any] = report.sources.model_dump(by_alias=True, exclude_unset=True)
    kineto = [t for t in traces if t.get("kind") == "kineto"]
    snapshots = [t for t in traces if t.get("kind") == "snapshot"]
    section: dict[str, Any] = {"kineto_files": len(kineto), "snapshot_files": len(snapshots)}
    update: dict[str, Any] = {}
    if kineto:
        try:
            combined = combine_ranks(kineto)
        except ValueError as exc:
            combined = {"error": str(exc)}
        section["kineto"] = combined
        totals = combined.get("totals") or {}
        breakdown = breakdown_of(totals)
        update["time"] = report.time.model_copy(update={"breakdown": breakdown})
        sources["time.breakdown"] = "kineto (HTA-compatible temporal breakdown)"
        memory = report.memory.model_dump(exclude_unset=True)
        for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
            if memory.get(key) is None and totals.get(key) is not None:
                memory[key] = totals[key]
                sources[f"memory.{key}"] = "kineto [memory] events"
        if memory.get("fragmentation_bytes") is None and memory.get("peak_reserved_bytes") is not None \
                and memory.get("peak_allocated_bytes") is not None:
            memory["fragmentation_bytes"] = memory["peak_reserved_bytes"] - memory["peak_allocated_bytes"]
            sources["memory.fragmentation_bytes"] = "kineto [memory] events (peak reserved - peak allocated)"
        update["memory"] = type(report.memory).model_validate(memory)
    if snapshots:
        section["snapshot"] = {k: v for k, v in snapshots[-1].items() if k not in ("optimization", "plans")}
    plan = largest_plan(traces)
    if plan is not None:
        trace, optimization = plan
        update["optimization"] = {**optimization, "source": f"{trace.get('kind')}:{trace.get('filename')}"}
        sources["optimization"] = f"allocation trace from {trace.get('kind')} upload {trace.get('filename')!r}"
        computed = optimization.get("allocator_recommendation")  # allocator settings compared by simulation
        if computed and not _already_set(computed, report.framework):
            rec = Recommendation.model_validate(computed)
            update["recommendations"] = [*(r for r in report.recommendations if r.kind != rec.kind), rec]
    else:
        update["optimization"] = None
    return report.model_copy(update={**update, "traces": TracesSection.model_validate(section),
                                     "sources": Sources.model_validate(sources)})


def _already_set(recommendation: dict[str, Any], framework: FrameworkSection | None) -> bool:
    """The job already ran with every option the allocator-settings recommendation sets (the hooks read its
    PYTORCH_CUDA_ALLOC_CONF): the traced run shows the setting's effect, not a saving still to be had."""
    running = framework.cuda_alloc_conf if framework is not None else None
    env = (recommendation.get("evidence") or {}).get("env") or ""
    wanted = env.partition("=")[2]
    if running is None or not wanted:
        return False
    have = {o.strip().replace(" ", "") for o in running.split(",") if o.strip()}
    return all(o.strip().replace(" ", "") in have for o in wanted.split(","))


def merge_trace_sections(report: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    """`trace_sections` on a report's JSON document (as `characterize` returns it), which is updated in place and
    returned; the merged document is validated as a `JobReport` on the way."""
    merged = trace_sections(JobReport.model_validate(report), traces)
    report.clear()
    report.update(merged.model_dump(mode="json", exclude_unset=True))
    return report
