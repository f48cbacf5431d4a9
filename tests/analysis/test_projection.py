"""Projection onto another GPU (server/analysis/projection): each category scales by its own ratio, identity
returns the measurement, power and memory follow the target's catalogue figures."""

from __future__ import annotations

import pytest

from server.analysis.base.gpu_catalog import find_model
from server.analysis.energy.power_model import WAITING_POWER_FRACTION, power_fraction
from server.analysis.projection.inputs import NotEnoughData, measured_from_inputs, measured_from_report
from server.analysis.projection.project import MeasuredRun, normalize_precision, project
from server.analysis.projection.shares import StepShares, from_kineto, from_telemetry

A100, V100, L40S, T4, H100 = (find_model(n) for n in ("A100-40GB", "V100-16GB", "L40S", "T4", "H100-80GB"))


def _shares(cb: float = 0.0, mb: float = 0.0, comm: float = 0.0, idle: float = 0.0) -> StepShares:
    return StepShares(compute_bound=cb, memory_bound=mb, communication=comm, idle=idle,
                      compute_bound_low=cb, compute_bound_high=cb, basis="kineto")


def test_memory_bound_step_scales_by_the_bandwidth_ratio() -> None:
    p = project(MeasuredRun(gpu=A100, step_time_s=0.1, shares=_shares(mb=1.0)), V100)
    assert p.step_time_s.central == pytest.approx(0.1 * 1555e9 / 900e9)
    assert p.step_time_s.low < p.step_time_s.central < p.step_time_s.high


def test_compute_bound_step_scales_by_the_flops_ratio_at_its_precision() -> None:
    fp32 = project(MeasuredRun(gpu=V100, step_time_s=0.2, shares=_shares(cb=1.0)), H100)
    assert fp32.step_time_s.central == pytest.approx(0.2 * 15.7 / 67.0)
    bf16 = project(MeasuredRun(gpu=A100, step_time_s=0.2, shares=_shares(cb=1.0), precision="torch.bfloat16"), H100)
    assert bf16.step_time_s.central == pytest.approx(0.2 * 312.0 / 989.0)
    # V100 has no bf16: a port runs fp16 on its tensor cores, and the projection says so
    onto_v100 = project(MeasuredRun(gpu=A100, step_time_s=0.2, shares=_shares(cb=1.0), precision="bf16"), V100)
    assert onto_v100.step_time_s.central == pytest.approx(0.2 * 312.0 / 125.0)
    assert any("no bf16" in n and "fp16" in n for n in onto_v100.notes)
    # P100 has no tensor cores: fp16 at its own (non-tensor) fp16 rate
    p100 = find_model("P100-PCIE-16GB")
    onto_p100 = project(MeasuredRun(gpu=V100, step_time_s=0.2, shares=_shares(cb=1.0), precision="fp16"), p100)
    assert onto_p100.step_time_s.central == pytest.approx(0.2 * 125.0 / 18.7)


def test_idle_time_does_not_scale_and_mixes_add_up() -> None:
    idle = project(MeasuredRun(gpu=T4, step_time_s=1.0, shares=_shares(idle=1.0)), H100)
    assert idle.step_time_s.central == pytest.approx(1.0)
    mixed = project(MeasuredRun(gpu=A100, step_time_s=1.0, shares=_shares(cb=0.5, mb=0.3, idle=0.2)), H100)
    assert mixed.step_time_s.central == pytest.approx(0.5 * 19.5 / 67 + 0.3 * 1555 / 3350 + 0.2)


@pytest.mark.parametrize("basis", ["kineto", "telemetry"])
def test_identity_projection_returns_the_measurement_within_its_band(basis: str) -> None:
    shares = _shares(cb=0.3, mb=0.5, comm=0.1, idle=0.1) if basis == "kineto" else from_telemetry(0.7)
    run = MeasuredRun(gpu=L40S, step_time_s=0.25, shares=shares, power_w=250.0, energy_per_step_j=62.5)
    p = project(run, L40S)
    assert p.step_time_s.central == pytest.approx(0.25)
    assert p.step_time_s.low < 0.25 < p.step_time_s.high
    assert p.power_w.central == pytest.approx(250.0)  # the measured power, calibrated back onto itself
    assert p.energy_per_step_j.low <= 62.5 <= p.energy_per_step_j.high
    assert p.memory.target_context_bytes == p.memory.source_context_bytes


def test_telemetry_band_spans_memory_bound_to_compute_bound() -> None:
    p = project(MeasuredRun(gpu=V100, step_time_s=1.0, shares=from_telemetry(1.0)), H100)
    compute_only, memory_only = 15.7 / 67.0, 900 / 3350
    assert p.step_time_s.low <= min(compute_only, memory_only) / 1.15 + 1e-9
    assert p.step_time_s.high >= max(compute_only, memory_only) * 1.15 - 1e-9
    assert p.basis == "telemetry"


def test_power_is_calibrated_by_the_measurement_and_capped_at_the_target_tdp() -> None:
    shares = _shares(cb=0.6, mb=0.4)
    modelled = power_fraction(0.6, 1.0)
    hot = project(MeasuredRun(gpu=A100, step_time_s=0.1, shares=shares, power_w=400.0), L40S)
    assert hot.power_w.central <= L40S.tdp_w and hot.power_w.high <= L40S.tdp_w
    cool = project(MeasuredRun(gpu=A100, step_time_s=0.1, shares=shares, power_w=0.5 * modelled * 400), L40S)
    model = project(MeasuredRun(gpu=A100, step_time_s=0.1, shares=shares), L40S)
    assert cool.power_w.central < model.power_w.central  # a run drawing half the model's power stays below it
    assert cool.power_source.startswith("measured") and model.power_source == "power model"
    assert cool.power_w.central >= WAITING_POWER_FRACTION * L40S.tdp_w
    e = cool.energy_per_step_j
    assert e.central == pytest.approx(cool.power_w.central * cool.step_time_s.central)


def test_memory_carries_the_allocator_peak_and_swaps_the_context() -> None:
    run = MeasuredRun(gpu=A100, step_time_s=0.1, shares=_shares(mb=1.0), peak_allocated_bytes=11 << 30,
                      peak_reserved_bytes=12 << 30)
    on_t4 = project(run, T4).memory
    assert on_t4.required_bytes == (12 << 30) + T4.cuda_context_bytes
    assert on_t4.fits is True and on_t4.headroom_bytes == T4.memory_bytes - on_t4.required_bytes
    big = MeasuredRun(gpu=A100, step_time_s=0.1, shares=_shares(mb=1.0), peak_reserved_bytes=30 << 30)
    assert project(big, T4).memory.fits is False and project(big, L40S).memory.fits is True
    unknown = project(MeasuredRun(gpu=A100, step_time_s=0.1, shares=_shares(mb=1.0)), T4).memory
    assert unknown.fits is None and unknown.required_bytes is None
    # telemetry alone: NVML's device peak, with the source's context swapped for the target's
    nvml = project(MeasuredRun(gpu=A100, step_time_s=0.1, shares=_shares(mb=1.0), peak_used_bytes=10 << 30), T4)
    assert nvml.memory.required_bytes == (10 << 30) - A100.cuda_context_bytes + T4.cuda_context_bytes
    assert any("NVML" in c for c in nvml.memory.changes)


def test_kineto_row_shares_add_up_and_bound_the_compute_share() -> None:
    row = {"span_us": 1000.0, "compute_us": 600.0, "communication_us": 100.0, "idle_us": 200.0,
           "memcpy_us": 80.0, "memset_us": 20.0, "compute_matmul_fraction": 0.5}
    s = from_kineto(row)
    assert s is not None
    assert s.compute_bound + s.memory_bound + s.communication + s.idle == pytest.approx(1.0)
    assert s.compute_bound == pytest.approx(0.3) and s.memory_bound == pytest.approx(0.4)
    assert s.compute_bound_low < s.compute_bound < s.compute_bound_high <= 0.6
    assert from_kineto({"span_us": 0}) is None


def test_report_without_gpu_or_step_time_is_not_enough_data() -> None:
    with pytest.raises(NotEnoughData, match="GPU type is unknown"):
        measured_from_report({"gpus": [], "time": {"step_time_s": {"mean": 0.1}}})
    with pytest.raises(NotEnoughData, match="not in the GPU catalogue"):
        measured_from_report({"gpus": [{"name": "Voodoo 5"}], "time": {"step_time_s": {"mean": 0.1}}})
    with pytest.raises(NotEnoughData, match="no step time"):
        measured_from_report({"gpus": [{"name": "NVIDIA L40S"}], "time": {"step_time_s": {"mean": None}}})


def test_report_with_telemetry_and_rightsizing_inputs() -> None:
    report = {"job_id": "j", "gpus": [{"name": "NVIDIA L40S", "mean_power_w": 200.0, "power_limit_w": 350.0}] * 2,
              "time": {"step_time_s": {"mean": 0.5}, "gpu_busy_fraction": 0.8}, "utilization": {"gpu_mean_pct": 90},
              "energy": {"energy_per_step_j": 200.0}, "memory": {"peak_reserved_bytes": 1 << 30},
              "framework": {"precision": "torch.float16"}}
    run = measured_from_report(report)
    assert run.gpu.name == "L40S" and run.gpu_count == 2 and run.shares.basis == "telemetry"
    assert run.shares.idle == pytest.approx(0.2)  # the busy fraction wins over NVML utilization
    assert normalize_precision(run.precision) == "fp16"
    inputs = measured_from_inputs({"gpu_name": "NVIDIA L40S", "step_time_s": 0.5, "gpu_util_mean_pct": 50,
                                   "energy_per_step_j": 200.0, "gpu_count": 2})
    assert inputs.power_w == pytest.approx(200.0)  # per GPU: 200 J / 0.5 s / 2 GPUs
    assert inputs.shares.idle == pytest.approx(0.5)


def test_rightsizing_lists_each_other_gpu_with_its_band_cheapest_first() -> None:
    from server.analysis.fleet.rightsizing import rightsize

    run = {"job_id": "r1", "gpu_name": "NVIDIA L40S", "gpu_count": 1, "step_time_s": 0.4, "gpu_util_mean_pct": 95,
           "energy_per_step_j": 100.0, "peak_used_bytes": 20 << 30, "peak_reserved_bytes": 20 << 30,
           "duration_s": 3600.0, "memory_total_bytes": L40S.memory_bytes, "interval_peaks_bytes": [20 << 30]}
    out = rightsize([run])
    assert out["projection_unavailable"] is None
    by_gpu = {c.gpu: c for c in out["projections"]}
    assert "L40S" not in by_gpu and {"T4", "H100-80GB", "A100-80GB"} <= by_gpu.keys()
    h100 = by_gpu["H100-80GB"]
    assert h100.step_time_ratio.low < h100.step_time_ratio.central < 1.0 < h100.step_time_ratio.high * 2
    assert h100.summary.startswith("on H100-80GB: ") and "x the step time [" in h100.summary
    assert h100.cost_per_step_ratio is not None and h100.energy_per_step_ratio is not None
    assert by_gpu["T4"].fits is False and "does not fit" in by_gpu["T4"].summary  # 20 GiB on a 15 GiB T4
    priced = [c for c in out["projections"] if c.fits is not False and c.cost_per_step_ratio is not None]
    assert [c.cost_per_step_ratio.central for c in priced] == sorted(c.cost_per_step_ratio.central for c in priced)
    no_step = rightsize([{**run, "step_time_s": None}])
    assert no_step["projections"] == [] and "step time" in no_step["projection_unavailable"]


@pytest.mark.parametrize("busy", [1.0, 0.6])
@pytest.mark.parametrize("cb", [0.0, 0.3, 0.8, 1.0])
def test_power_rule_inverted_gives_back_the_compute_share(cb: float, busy: float) -> None:
    from server.analysis.energy.power_model import compute_bound_from_power

    assert compute_bound_from_power(power_fraction(cb, busy), busy) == pytest.approx(cb)


def test_power_rule_inverted_clips_and_knows_when_it_cannot_tell() -> None:
    from server.analysis.energy.power_model import compute_bound_from_power

    assert compute_bound_from_power(1.2) == 1.0  # above the rule's GEMM-bound draw
    assert compute_bound_from_power(0.3) == 0.0  # below its memory-bound draw at full busy
    assert compute_bound_from_power(0.5, busy_fraction=0.0) is None  # never busy: the draw says nothing


def test_telemetry_split_follows_the_source_power() -> None:
    from server.analysis.projection import shares as shares_mod

    cool, hot, unknown = from_telemetry(1.0, 0.5), from_telemetry(1.0, 0.85), from_telemetry(1.0, None)
    assert cool.compute_bound < unknown.compute_bound < hot.compute_bound  # 0.5 of TDP reads memory-bound
    assert unknown.compute_bound == pytest.approx(shares_mod.DEFAULT_COMPUTE_BOUND_SHARE)
    assert "power rule" in hot.split_source and "prior" in unknown.split_source
    w = shares_mod.POWER_SIGNAL_WEIGHT
    assert hot.compute_bound == pytest.approx((1 - w) * shares_mod.DEFAULT_COMPUTE_BOUND_SHARE + w * 1.0)
    # the busy fraction scales the split: the share is of the busy time, the rest of the step is idle
    half = from_telemetry(0.5, power_fraction(1.0, 0.5))
    assert half.compute_bound == pytest.approx(0.5 * hot.compute_bound) and half.idle == pytest.approx(0.5)
    assert from_telemetry(1.0, 0.85, prior=0.5, weight=0.0).compute_bound == pytest.approx(0.5)


def test_telemetry_band_is_the_calibrated_factor_and_says_so() -> None:
    import math

    from server.analysis.projection.project import TELEMETRY_BAND_LOG_HALFWIDTH

    p = project(MeasuredRun(gpu=V100, step_time_s=1.0, shares=from_telemetry(0.9, 0.7), power_w=210.0), H100)
    factor = math.exp(TELEMETRY_BAND_LOG_HALFWIDTH)
    assert p.step_time_s.high == pytest.approx(p.step_time_s.central * factor)
    assert p.step_time_s.low == pytest.approx(p.step_time_s.central / factor)
    assert p.band_source is not None and p.band_source.startswith("calibrated")
    assert p.split_source is not None and "power rule" in p.split_source
    wider = project(MeasuredRun(gpu=V100, step_time_s=1.0, shares=from_telemetry(0.9, 0.7)), H100,
                    telemetry_band_log_halfwidth=2 * TELEMETRY_BAND_LOG_HALFWIDTH)
    assert wider.step_time_s.high == pytest.approx(wider.step_time_s.central * factor**2)
    kineto = project(MeasuredRun(gpu=V100, step_time_s=1.0, shares=_shares(cb=0.5, mb=0.5)), H100)
    assert kineto.band_source is not None and kineto.band_source.startswith("structural")
    assert kineto.split_source == "kineto kernel names"


def test_report_power_moves_the_telemetry_split() -> None:
    def report(power: float | None) -> dict[str, object]:
        return {"gpus": [{"name": "NVIDIA L40S", "mean_power_w": power}], "time": {"step_time_s": {"mean": 0.5}},
                "utilization": {"gpu_mean_pct": 100}}

    hot, cool, unknown = (measured_from_report(report(p)).shares for p in (330.0, 150.0, None))
    assert cool.compute_bound < unknown.compute_bound < hot.compute_bound
    onto = [project(measured_from_report(report(p)), H100).step_time_s.central for p in (330.0, 150.0)]
    assert onto[0] != pytest.approx(onto[1])  # the source's draw changes the projection
    inputs_hot = measured_from_inputs({"gpu_name": "NVIDIA L40S", "step_time_s": 0.5, "gpu_util_mean_pct": 100,
                                       "energy_per_step_j": 165.0})
    assert inputs_hot.shares.compute_bound == pytest.approx(hot.compute_bound)  # 165 J / 0.5 s = 330 W
