from __future__ import annotations

import json

from server.analysis.planning.fragmentation import fragmentation_findings, online_best_fit_bytes, summarize_snapshot
from server.analysis.planning.optimization import optimization_and_plans
from server.analysis.planning.packing import plan_offsets
from server.analysis.traces.alloc_trace import from_triples


def _by_kind(findings):
    return {f["kind"]: f for f in findings}


def test_internal_rounding_from_requested_sizes() -> None:
    trace = from_triples([(1000, 0, 2), (100, 1, 3)])
    f = _by_kind(fragmentation_findings(trace, observed_reserved_bytes=2 << 20, observed_allocated_bytes=1536))
    assert f["internal_rounding"]["waste_bytes"] == (1024 - 1000) + (512 - 100)
    assert f["external_fragmentation"]["saving_bytes"] == (2 << 20) - 1536
    assert f["expandable_segments"]["estimated_reserved_bytes"] == 2 << 20


def test_snapshot_summary_counts_inactive_splits() -> None:
    snapshot = {"segments": [
        {"total_size": 4096, "blocks": [
            {"size": 1024, "requested_size": 1000, "state": "active_allocated"},
            {"size": 3072, "state": "inactive"}]},
        {"total_size": 2048, "blocks": [{"size": 2048, "state": "inactive"}]},
    ]}
    s = summarize_snapshot(snapshot)
    assert s == {"reserved_bytes": 6144, "allocated_bytes": 1024, "inactive_bytes": 5120,
                 "inactive_split_bytes": 3072, "largest_inactive_block_bytes": 3072, "segments": 2,
                 "requested_bytes": 1000}
    f = _by_kind(fragmentation_findings(None, snapshot=snapshot))
    assert f["internal_rounding"]["waste_bytes"] == 24
    assert f["external_fragmentation"]["saving_bytes"] == 5120
    assert "inactive splits" in f["external_fragmentation"]["reason"]


def test_real_trace_findings_and_section(real_traces) -> None:
    tr = real_traces["v100_ddp"]
    section, _plans = optimization_and_plans(tr, pcie_bandwidth_bytes_per_s=12e9)
    json.dumps(section, allow_nan=False)  # JSON-safe
    op = section["offset_plan"]
    assert op["allocations"] == len(tr)
    assert op["lower_bound_bytes"] <= op["planned_bytes"] <= 1.05 * op["lower_bound_bytes"]
    assert op["observed_reserved_bytes"] == tr.observed_reserved_bytes
    assert op["potential_saving_bytes"] == op["observed_reserved_bytes"] - op["planned_bytes"] > 0
    kinds = _by_kind(section["fragmentation"])
    assert kinds["internal_rounding"]["saving_bytes"] is None  # Kineto sizes are already rounded
    assert kinds["allocation_order"]["saving_bytes"] == op["potential_saving_bytes"]
    assert online_best_fit_bytes(tr) >= plan_offsets(tr).lower_bound_bytes
    sw = section["swap_plan"]
    assert sw["new_peak_bytes"] <= sw["old_peak_bytes"] == op["lower_bound_bytes"]
