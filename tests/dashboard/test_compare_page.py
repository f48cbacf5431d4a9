"""The dashboard's compare view: the applied recommendations with predicted and realized saving, every figure with
its unit, unknown as "unknown"."""

from __future__ import annotations

import json

from plotly.utils import PlotlyJSONEncoder

from dashboard.pages.compare import compare_view
from server.analysis.compare import compare_runs

GIB = 2**30
APPLIED = {"kind": "allocator_settings", "summary": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
           "predicted_saving": {"reserved_bytes": 8 * GIB, "reserved_pct": 25.0}, "from_job": "before",
           "setting": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}


def _text(components) -> str:  # type: ignore[no-untyped-def]
    return json.dumps(components, cls=PlotlyJSONEncoder)


def test_applied_table_shows_predicted_and_realized():
    before = {"job_id": "before", "memory": {"peak_reserved_bytes": 32 * GIB}}
    after = {"job_id": "after", "memory": {"peak_reserved_bytes": 24 * GIB}}
    out = compare_runs([({"job_id": "before"}, before), ({"job_id": "after", "applied": [APPLIED]}, after)])
    text = _text(compare_view(out))
    assert "compare-applied" in text and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    assert "reserved_bytes: 8.00 GiB, reserved_pct: 25.0 %" in text
    assert "peak_reserved_bytes: 8.00 GiB less than before (25.0 %)" in text


def test_no_applied_recommendation_says_so():
    out = compare_runs([({"job_id": "a"}, {"job_id": "a"}), ({"job_id": "b"}, {"job_id": "b"})])
    text = _text(compare_view(out))
    assert "no run applied a recommendation" in text and "unknown" in text
