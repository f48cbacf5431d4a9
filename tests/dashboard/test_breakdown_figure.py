"""The stacked memory-breakdown bar: one bar per breakdown, one trace per known part, unknown parts left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dashboard import data
from dashboard.figures import GIB, memory_breakdown_bar

GOLDEN = Path(__file__).resolve().parents[1] / "analysis" / "golden" / "characterize_real_job.json"


def _part(nbytes: int | None) -> dict:
    return {"bytes": nbytes, "source": "test"}


def test_stacked_bar_per_breakdown_with_module_activations() -> None:
    estimate = {"weights": _part(2 * GIB), "gradients": _part(GIB), "optimizer_state": _part(4 * GIB),
                "activations": _part(3 * GIB),
                "activations_by_module": [{"module": "encoder", "bytes": 2 * GIB}, {"module": "head", "bytes": GIB}],
                "inputs": _part(0), "temporaries_and_workspaces": _part(GIB // 2), "persistent_unsplit": _part(0),
                "allocator_rounding": _part(GIB // 4), "cached_free": _part(GIB), "cuda_context": _part(None),
                "total_bytes": 12 * GIB - GIB // 4}
    measured = {"weights": _part(None), "persistent_unsplit": _part(5 * GIB), "step_allocations": _part(GIB),
                "cached_free": _part(2 * GIB), "cuda_context": _part(None), "activations_by_module": []}
    fig = memory_breakdown_bar([("H100", estimate), ("measured", measured), ("nothing", None)])
    assert fig.layout.barmode == "stack"
    names = [t.name for t in fig.data]
    assert "activations: encoder" in names and "activations: head" in names and "activations" not in names
    assert "CUDA context" not in names and "inputs" not in names  # unknown and zero parts are not drawn
    assert all(list(t.x) == ["H100", "measured"] for t in fig.data)
    heights = [sum((t.y[i] or 0) for t in fig.data) for i in range(2)]
    assert abs(heights[0] - estimate["total_bytes"] / GIB) < 1e-9
    assert "allocated in the window (activations + temporaries)" in names
    assert abs(heights[1] - 8) < 1e-9  # persistent 5 + window 1 + cached 2 GiB


def test_no_breakdown_is_an_empty_figure() -> None:
    fig = memory_breakdown_bar([("H100", None)])
    assert fig.layout.annotations[0].text == "no memory breakdown"


def _find(component: Any, wanted_id: str) -> Any:
    if getattr(component, "id", None) == wanted_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            found = _find(child, wanted_id)
            if found is not None:
                return found
    return None


def test_the_estimator_answer_and_the_job_plans_draw_the_bar() -> None:
    from dashboard.pages.estimate import result_view
    from dashboard.pages.job import optimization_section

    part = {"bytes": GIB, "source": "test"}
    breakdown = {"weights": part, "cached_free": part, "activations_by_module": [], "total_bytes": 2 * GIB}
    answer = result_view({"breakdown": breakdown, "gpus": [{"gpu": "H100-80GB", "breakdown": breakdown}]})
    graph = _find(answer, "est-breakdown")
    assert graph is not None
    assert [list(t.x) for t in graph.figure.data] == [["tensors (no GPU)", "H100-80GB"]] * 2
    report = data.job_report(json.loads(GOLDEN.read_text())["traced"])
    section = optimization_section(report.model_copy(update={"optimization": {"memory_breakdown": breakdown}}))
    graph = _find(section, "job-memory-breakdown")
    assert graph is not None and len(graph.figure.data) == 2
