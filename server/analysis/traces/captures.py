"""The report's `captures` section: each live capture with its trigger and state, the time breakdown of an analyzed
kineto capture's traces, and an automatic capture's step medians against the baseline. Pure: stored rows as plain
data in, the typed section out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetprof.report import CaptureComparison, CaptureEntry, CapturesSection
from server.analysis.traces.sections import kineto_breakdown


@dataclass(frozen=True)
class CaptureRow:
    capture_id: str
    kind: str
    steps: int
    ranks: list[int] | None
    state: str
    reason: str | None
    trigger: dict[str, Any]
    requested_at_s: float
    analyzed_at_s: float | None
    trace_ids: list[int] = field(default_factory=list)


def _comparison(trigger: dict[str, Any]) -> CaptureComparison | None:
    base, recent = trigger.get("baseline_median_step_s"), trigger.get("recent_median_step_s")
    if not isinstance(base, (int, float)) or not isinstance(recent, (int, float)) or base <= 0:
        return None
    return CaptureComparison(baseline_median_step_s=base, recent_median_step_s=recent, factor=recent / base)


def captures_section(rows: list[CaptureRow], summaries: dict[int, dict[str, Any]]) -> CapturesSection | None:
    """`rows` newest first; `summaries`: stored trace summaries by trace id, each with its `kind`. None: no
    captures."""
    if not rows:
        return None
    entries = []
    for row in rows:
        kineto = [summaries[t] for t in row.trace_ids if summaries.get(t, {}).get("kind") == "kineto"]
        entries.append(CaptureEntry(
            capture_id=row.capture_id, kind=row.kind, steps=row.steps, ranks=row.ranks, state=row.state,
            reason=row.reason, trigger_kind=str(row.trigger.get("kind", "manual")),
            trigger_summary=str(row.trigger.get("summary", "")), requested_at=row.requested_at_s,
            analyzed_at=row.analyzed_at_s, trace_ids=list(row.trace_ids),
            breakdown=kineto_breakdown(kineto) if row.state == "analyzed" else None,
            comparison=_comparison(row.trigger)))
    return CapturesSection(captures=entries)
