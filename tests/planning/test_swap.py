from __future__ import annotations

import numpy as np

from server.analysis.planning.swap import plan_swaps, resolve_pcie_bandwidth
from server.analysis.traces.alloc_trace import from_triples, max_live_bytes

MIB = 1 << 20


def _training_step(n_layers: int = 8, act_bytes: int = 64 * MIB, step_s: float = 1.0, t0: float = 0.0):
    """Forward allocates one activation per layer, backward frees them in reverse; 1 ms per op."""
    rows = [(512 * MIB, t0 - 1.0, None)]  # weights, live throughout: never a candidate
    fwd = [t0 + 0.01 * k for k in range(n_layers)]
    bwd_end = t0 + step_s - 0.01
    for k in range(n_layers):
        rows.append((act_bytes, fwd[k], bwd_end - 0.01 * k))
    return rows


def test_forward_activations_swap_and_copies_hide() -> None:
    trace = from_triples(_training_step(), time_unit_s=1.0)
    plan = plan_swaps(trace, pcie_bandwidth_bytes_per_s=12e9, step_boundaries_s=[-0.5, 1.0])
    assert plan.candidates == 8 and plan.index.size > 0
    assert plan.old_peak_bytes == max_live_bytes(trace)
    assert plan.new_peak_bytes < plan.old_peak_bytes
    # each kept copy fits its window, offload before prefetch, one copy at a time per direction
    a, f = trace.alloc_t[plan.index], trace.free_t[plan.index]
    assert np.all(plan.offload_start_s >= a) and np.all(plan.prefetch_end_s <= f)
    assert np.all(plan.offload_end_s < plan.prefetch_start_s)
    o = np.sort(np.stack([plan.offload_start_s, plan.offload_end_s], 1), 0)
    assert np.all(o[1:, 0] >= o[:-1, 1] - 1e-12)
    assert plan.pinned_host_bytes >= plan.saved_bytes > 0
    assert plan.forced_stall_s == 0.0 and plan.projected_slowdown_fraction == 0.0


def test_slow_link_hides_nothing_and_projects_a_slowdown() -> None:
    trace = from_triples(_training_step(step_s=0.2), time_unit_s=1.0)
    # 64 MiB at 0.5 GB/s: 134 ms each way, longer than any activation's idle window
    plan = plan_swaps(trace, pcie_bandwidth_bytes_per_s=0.5e9, step_boundaries_s=[-0.5, 0.2])
    assert plan.index.size == 0 and plan.new_peak_bytes == plan.old_peak_bytes
    assert plan.forced_swaps > 0 and plan.forced_new_peak_bytes < plan.old_peak_bytes
    assert plan.projected_slowdown_fraction is not None and plan.projected_slowdown_fraction > 0


def test_pcie_bandwidth_from_catalogue() -> None:
    assert resolve_pcie_bandwidth(None, "NVIDIA H100 80GB HBM3") == (50e9, "catalogue:H100-80GB")
    assert resolve_pcie_bandwidth(7e9, "H100")[0] == 7e9
    assert resolve_pcie_bandwidth(None, None)[1].startswith("catalogue-slowest")


def test_real_trace_swap_plan_saves_memory(real_traces) -> None:
    tr = real_traces["v100_ddp"]
    plan = plan_swaps(tr, gpu_name="V100")
    assert plan.old_peak_bytes == max_live_bytes(tr)
    assert 0 < plan.saved_bytes < plan.old_peak_bytes
    assert plan.forced_new_peak_bytes <= plan.new_peak_bytes
