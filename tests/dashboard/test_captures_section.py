"""The job page's Captures section and Capture control (issue #19), rendered from typed API answers without a
browser: trigger and summary, state, kind, steps, times; an analyzed capture's breakdown with units; an automatic
capture's baseline vs recent step medians in ms; unknown shown as unknown, never 0."""

from __future__ import annotations

from typing import Any

from dashboard.pages.job import capture_breakdown, capture_control_state, capture_medians, captures_table
from fleetprof.api_models import Capture, JobRead
from fleetprof.report import CaptureEntry, TimeBreakdown


def _capture(**fields: Any) -> Capture:
    base: dict[str, Any] = {
        "capture_id": "cap-a", "job_id": "j", "kind": "kineto", "steps": 5, "ranks": None, "state": "requested",
        "reason": None, "trigger": {"kind": "manual", "summary": "requested from the dashboard"},
        "requested_at": "2026-11-25T10:00:00Z", "delivered_at": None, "capturing_at": None, "uploaded_at": None,
        "analyzed_at": None, "failed_at": None, "trace_ids": [], "requested_by": "team:nlp"}
    return Capture.model_validate({**base, **fields})


def _entry(capture_id: str, breakdown: dict[str, Any] | None, comparison: dict[str, Any] | None = None) -> CaptureEntry:
    return CaptureEntry.model_validate({
        "capture_id": capture_id, "kind": "kineto", "steps": 5, "ranks": None, "state": "analyzed", "reason": None,
        "trigger_kind": "manual", "trigger_summary": "", "requested_at": 1.7e9, "analyzed_at": 1.7e9 + 60,
        "trace_ids": [1], "breakdown": breakdown, "comparison": comparison})


def _job(state: str) -> JobRead:
    return JobRead.model_validate({
        "job_id": "j", "team": None, "name": None, "command": None, "framework": None, "host": None, "user": None,
        "node": None, "state": state, "batch_size": None, "gpu_type_requested": None, "gpus_requested": None,
        "exit_code": None, "created_at": 1.7e9, "updated_at": 1.7e9, "started_at": None, "ended_at": None,
        "duration_s": None, "gpu_uuids": [], "metadata": {}})


def _cells(component: Any) -> list[list[str]]:
    """The table's body rows as the text of each cell."""
    def text(node: Any) -> str:
        if node is None:
            return ""
        if isinstance(node, (str, int, float)):
            return str(node)
        if isinstance(node, list):
            return " ".join(text(n) for n in node)
        return text(getattr(node, "children", None))

    body = component.children[1]
    return [[text(td) for td in tr.children] for tr in body.children]


def test_a_requested_manual_capture_lists_its_state_and_unknowns() -> None:
    [row] = _cells(captures_table([_capture()]))
    capture, trigger, state, kind, steps, ranks, requested, last, by, result = row
    assert capture == "cap-a" and "manual" in trigger and "requested from the dashboard" in trigger
    assert state == "requested" and kind == "kineto" and steps == "5 steps" and ranks == "all"
    assert requested == "2026-11-25 10:00:00 UTC" and last == "unknown" and by == "team:nlp"
    assert result == "not analyzed yet"
    assert "0 ms" not in " ".join(row) and "0.0 %" not in " ".join(row)


def test_an_analyzed_capture_shows_its_breakdown_with_units() -> None:
    c = _capture(state="analyzed", analyzed_at="2026-11-25T10:02:00Z", trace_ids=[7], ranks=[0, 1])
    entry = _entry("cap-a", {"idle_pct": 12.5, "compute_pct": 80.0, "non_compute_pct": 7.5, "span_us": 2_500_000.0,
                             "communication_us": None})
    [row] = _cells(captures_table([c], {"cap-a": entry}))
    assert row[5] == "0, 1" and row[7] == "2026-11-25 10:02:00 UTC"
    assert row[9] == capture_breakdown(entry.breakdown)
    assert "compute 80.0 %" in row[9] and "idle 12.5 %" in row[9] and "non-compute 7.5 %" in row[9]
    assert "communication unknown" in row[9] and "span 2.5" in row[9]
    # no report entry (the report not read, or not there yet): unknown, not zeros
    assert _cells(captures_table([c]))[0][9] == "unknown"
    assert capture_breakdown(TimeBreakdown()) == \
        "compute unknown, non-compute unknown, idle unknown; span unknown, communication unknown"


def test_an_automatic_capture_shows_baseline_and_recent_step_medians_in_ms() -> None:
    trigger = {"kind": "step_time_regression", "summary": "median step time 2.0x its baseline",
               "baseline_median_step_s": 0.1, "recent_median_step_s": 0.2, "factor": 2.0}
    c = _capture(trigger=trigger, requested_by=None)
    [row] = _cells(captures_table([c]))
    assert "automatic: step-time regression" in row[1] and "median step time 2.0x its baseline" in row[1]
    assert "baseline 100.0 ms → recent 200.0 ms (×2.00)" in row[1]
    assert row[8] == "unknown"
    # medians missing from the trigger: the report's comparison, else unknown (never 0 ms)
    bare = _capture(trigger={"kind": "straggler", "summary": "rank 3 slow"})
    assert capture_medians(bare, None) == "baseline unknown → recent unknown (factor unknown)"
    entry = _entry("cap-a", None, {"baseline_median_step_s": 0.05, "recent_median_step_s": 0.075, "factor": 1.5})
    assert capture_medians(bare, entry) == "baseline 50.0 ms → recent 75.0 ms (×1.50)"
    assert capture_medians(_capture(), entry) is None  # a manual capture has no medians


def test_failed_and_empty() -> None:
    c = _capture(state="failed", reason="torch.profiler not available", failed_at="2026-11-25T10:01:00Z")
    [row] = _cells(captures_table([c]))
    assert "failed" in row[2] and "torch.profiler not available" in row[2] and row[9] == "none (failed)"
    assert captures_table([]).children == "no captures of this job"


def test_the_control_is_only_for_a_running_job() -> None:
    assert capture_control_state(_job("running"))[0] is False
    for state in ("finished", "failed", "oom", "lost", "killed"):
        disabled, why = capture_control_state(_job(state))
        assert disabled is True and state in why and "running" in why
