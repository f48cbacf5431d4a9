"""The measured breakdown of a real H100 trace against the allocator's own recorded totals."""

from __future__ import annotations

from pathlib import Path

from server.analysis import alloc_trace
from server.analysis.memory_breakdown import measured_breakdown
from server.estimate.reserved_replay import read_memory_events


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
