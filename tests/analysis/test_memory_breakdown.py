"""The measured breakdown of a real H100 trace against the allocator's own recorded totals."""

from __future__ import annotations

import json
from pathlib import Path

from server.analysis.planning.reserved_replay import read_memory_events
from server.analysis.traces import alloc_trace
from server.analysis.traces.memory_breakdown import OUTSIDE_MODULES, measured_breakdown
from server.analysis.traces.module_spans import OUTSIDE_CHILDREN, read_module_spans


def test_breakdown_of_a_real_trace_adds_up_to_the_recorded_totals(real_data: Path) -> None:
    path = real_data / "kineto" / "tracelens" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"
    b = measured_breakdown(alloc_trace.from_kineto(path))
    [dev] = read_memory_events(path)  # the recorded figures, read independently of alloc_trace
    peak_allocated = max(e.total_allocated_bytes for e in dev.events)
    reserved = max(e.total_reserved_bytes for e in dev.events)
    assert b.persistent_unsplit.bytes is not None and b.step_allocations is not None
    assert b.persistent_unsplit.bytes + (b.step_allocations.bytes or 0) == peak_allocated
    assert b.cached_free.bytes == reserved - peak_allocated
    assert b.total_bytes == reserved
    assert b.weights.bytes is None and b.activations_by_module == []  # Kineto events name no tensor or module


def test_window_allocations_split_by_the_top_level_module_that_made_them(real_data: Path) -> None:
    path = real_data / "kineto" / "tracelens" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"
    spans = read_module_spans(path)
    assert spans is not None
    b = measured_breakdown(alloc_trace.from_kineto(path), modules=spans)
    assert b.step_allocations is not None
    assert sum(m.bytes for m in b.step_allocations_by_module) == b.step_allocations.bytes
    top_names = {name for _, _, name in spans.top_level}
    assert {m.module for m in b.step_allocations_by_module} <= top_names | {OUTSIDE_CHILDREN, OUTSIDE_MODULES}
    assert "BertModel_0" in top_names and "BertLMHeadModel_0" not in top_names  # that one is the model itself


def test_module_spans_nest_by_time_per_thread(tmp_path: Path) -> None:
    def call(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": "python_function", "name": f"nn.Module: {name}", "ts": ts, "dur": dur,
                "pid": 1, "tid": tid}

    events = [call("Net_0", 0, 100), call("Encoder_0", 10, 40), call("Linear_0", 12, 5), call("Head_0", 60, 30),
              call("Other_0", 20, 10, tid=2), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 13, "dur": 1}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    spans = read_module_spans(path)
    assert spans is not None
    assert [name for _, _, name in spans.top_level] == ["Encoder_0", "Head_0"]  # Linear_0 is depth 2
    assert spans.top_level_at(13) == "Encoder_0" and spans.top_level_at(75) == "Head_0"
    assert spans.top_level_at(55) == OUTSIDE_CHILDREN and spans.top_level_at(150) is None
