"""The roofline's two clocks: a step takes the GPU's busy time or the host's time to issue its ops in eager mode,
whichever is longer; power follows the share of the step the GPU computes."""

from __future__ import annotations

from server.analysis.base.gpu_catalog import find_model
from server.estimate.roofline import EFFICIENCY, OpCost, power_fraction, step_time


def _h100():  # type: ignore[no-untyped-def]
    gpu = find_model("H100-80GB")
    assert gpu is not None
    return gpu


def test_many_tiny_ops_are_host_bound() -> None:
    ops = [OpCost(flops=1e3, bytes=4e3, kind="other", lowp=False)] * 500
    t = step_time(ops, _h100(), None)
    assert t.host_bound and t.host_s == 500 * EFFICIENCY.host_per_op_s
    assert t.central_s == t.host_s and abs(t.gpu_s - 500 * EFFICIENCY.launch_floor_s) < 1e-12
    assert t.low_s == 500 * EFFICIENCY.host_per_op_low_s < t.central_s < t.high_s
    assert 0 < t.busy_fraction < 0.2


def test_a_few_large_gemms_are_gpu_bound() -> None:
    n = 8192
    gemm = OpCost(flops=2.0 * n**3, bytes=3 * 4.0 * n * n, kind="matmul", lowp=True)
    t = step_time([gemm] * 10, _h100(), "bf16")
    assert not t.host_bound and t.central_s == t.gpu_s > t.host_s
    assert t.busy_fraction == 1.0 and t.compute_bound_fraction == 1.0


def test_power_falls_towards_the_waiting_draw_as_the_gpu_waits_on_the_host() -> None:
    busy = power_fraction(1.0, 1.0)
    assert busy == 0.85
    assert power_fraction(1.0, 0.0) == EFFICIENCY.waiting_power_fraction
    assert EFFICIENCY.waiting_power_fraction < power_fraction(0.0, 0.5) < power_fraction(0.0, 1.0) == 0.5
