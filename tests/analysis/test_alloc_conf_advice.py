"""The allocator-settings recommendation worded from a simulated comparison, and merged into the report."""

from __future__ import annotations

import json
from pathlib import Path

from fleetprof.report import AllocConfAdvice, AllocConfCandidate, Recommendation
from server.analysis.planning.alloc_conf_advice import alloc_conf_recommendation
from server.analysis.traces.sections import merge_trace_sections

MiB = 1 << 20


GOLDEN = Path(__file__).resolve().parent / "golden" / "characterize_real_job.json"

def _advice(baseline: int | None, best: int, conf: str, note: str | None = None) -> AllocConfAdvice:
    saving = None if baseline is None else baseline - best
    return AllocConfAdvice(
        device="cuda:0", events=10, source="simulated: test", capacity_bytes=None, peak_allocated_bytes=100 * MiB,
        recorded_peak_reserved_bytes=400 * MiB, baseline_peak_reserved_bytes=baseline,
        candidates=[AllocConfCandidate(alloc_conf="", peak_reserved_bytes=baseline, out_of_memory=baseline is None),
                    AllocConfCandidate(alloc_conf=conf, peak_reserved_bytes=best, out_of_memory=False, note=note)],
        best_alloc_conf=conf, best_peak_reserved_bytes=best, saving_bytes=saving,
        saving_pct=None if saving is None or baseline is None else 100 * saving / baseline,
        env=f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else None)


def test_recommendation_carries_env_saving_and_evidence() -> None:
    rec = alloc_conf_recommendation(_advice(380 * MiB, 200 * MiB, "expandable_segments:True"))
    assert rec is not None
    Recommendation.model_validate(rec)  # the report's shape
    assert rec["evidence"]["env"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert rec["saving"] == {"reserved_bytes": 180 * MiB, "reserved_pct": 100 * 180 / 380}
    assert "180.00 MiB less" in rec["summary"] and "47.4 %" in rec["summary"]
    assert "400.00 MiB reserved" in rec["reason"]  # the recorded figure stands beside the simulated ones


def test_defaults_best_gives_no_recommendation_and_oom_gives_no_saving() -> None:
    assert alloc_conf_recommendation(_advice(100 * MiB, 100 * MiB, "")) is None
    rec = alloc_conf_recommendation(_advice(None, 40 * MiB, "garbage_collection_threshold:0.6", note="needs a cap"))
    assert rec is not None and rec["saving"] is None
    assert "run out of memory" in rec["summary"] and "needs a cap" in rec["reason"]


def test_merged_into_the_report_recommendations_once() -> None:
    rec = alloc_conf_recommendation(_advice(380 * MiB, 200 * MiB, "expandable_segments:True"))
    trace = {"kind": "kineto", "filename": "t.json.gz", "optimization": {"allocator_recommendation": rec}}
    report = json.loads(GOLDEN.read_text())["finished"]  # a real report, as characterize stores it
    old = {"kind": "allocator_settings", "summary": "old", "reason": "guessed", "evidence": {}, "saving": None}
    report["recommendations"] = [old, {**old, "kind": "power_cap", "summary": "cap"}]
    merge_trace_sections(report, [trace])
    assert [r["kind"] for r in report["recommendations"]] == ["power_cap", "allocator_settings"]
    assert report["recommendations"][-1] == json.loads(json.dumps(rec))
