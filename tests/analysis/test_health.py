"""Health findings, NVML-only stragglers and MFU on synthetic arrays whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from server.analysis.base.durations import hold_last
from server.analysis.base.jobdata import GpuSeries, JobData
from server.analysis.health import reasons
from server.analysis.health.findings import counter_increase, gpu_findings, health_section
from server.analysis.time.gpu_stragglers import nvml_stragglers
from server.analysis.time.mfu import mfu_section

T0 = 1_793_491_200.0


def _gpu(n: int = 600, name: str | None = "NVIDIA H100 80GB HBM3", **cols: np.ndarray | float) -> GpuSeries:
    ts = T0 + np.arange(n, dtype=np.float64)
    full = {k: (np.full(n, float(v)) if np.isscalar(v) else np.asarray(v, dtype=np.float64)) for k, v in cols.items()}
    return GpuSeries(uuid="GPU-a", name=name, memory_total_bytes=None, ts=ts, columns=full)


def test_bits_follow_nvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    assert pynvml.nvmlClocksEventReasonGpuIdle == reasons.GPU_IDLE
    assert pynvml.nvmlClocksEventReasonSwThermalSlowdown == reasons.SW_THERMAL_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonHwThermalSlowdown == reasons.HW_THERMAL_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonSwPowerCap == reasons.SW_POWER_CAP
    assert pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown == reasons.HW_POWER_BRAKE_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonHwSlowdown == reasons.HW_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonApplicationsClocksSetting == reasons.APPLICATIONS_CLOCKS_SETTING
    assert pynvml.nvmlClocksEventReasonSyncBoost == reasons.SYNC_BOOST


def test_idle_application_clock_and_sync_boost_bits_are_not_slowdowns() -> None:
    bits = reasons.GPU_IDLE | reasons.APPLICATIONS_CLOCKS_SETTING | reasons.SYNC_BOOST | reasons.DISPLAY_CLOCK_SETTING
    g = _gpu(throttle_reasons=bits, gpu_util_pct=0.0, sm_clock_mhz=345.0)
    assert gpu_findings(g) == []
    assert not reasons.any_slowdown(np.array([bits, np.nan])).any()


def test_each_slowdown_kind_with_its_seconds_and_cost() -> None:
    n = 600
    r = np.zeros(n)
    r[100:220] = reasons.SW_THERMAL_SLOWDOWN | reasons.HW_SLOWDOWN  # thermal explains the HW slowdown bit
    r[300:330] = reasons.SW_POWER_CAP | reasons.GPU_IDLE
    r[400:405] = reasons.HW_SLOWDOWN  # 5 s: under the noise floor
    clock = np.where(r != 0, 1400.0, 1980.0)
    found = {f.kind: f for f in gpu_findings(_gpu(throttle_reasons=r, sm_clock_mhz=clock, gpu_util_pct=99.0))}
    assert set(found) == {"thermal", "power_cap"}
    th = found["thermal"]
    assert th.seconds == pytest.approx(120.0) and th.fraction == pytest.approx(120 / 600)
    assert th.since_ts == T0 + 100 and th.until_ts == T0 + 219 and th.episodes == 1
    assert th.sm_clock_drop_pct == pytest.approx(100 * (1 - 1400 / 1980))
    assert th.sm_clock_reference_source == "catalogue:H100-80GB"
    assert found["power_cap"].seconds == pytest.approx(30.0)


def test_reference_clock_from_the_agent_beats_the_catalogue_and_falls_back_to_the_gpu_itself() -> None:
    r = np.where(np.arange(600) < 60, reasons.HW_THERMAL_SLOWDOWN, 0)
    clock = np.where(r != 0, 1000.0, 1500.0)
    g = _gpu(name="Unknown GPU", throttle_reasons=r, sm_clock_mhz=clock, gpu_util_pct=95.0)
    (f,) = gpu_findings(g)
    assert f.sm_clock_reference_mhz == 1500.0 and "median" in (f.sm_clock_reference_source or "")
    g.max_sm_clock_mhz = 2000.0
    found = {x.kind: x for x in gpu_findings(g)}
    assert set(found) == {"thermal", "sm_clock_low"}  # 1500 MHz when not slowed is itself low against 2000
    f = found["thermal"]
    assert f.sm_clock_reference_mhz == 2000.0 and f.sm_clock_reference_source == "nvml:max_sm_clock_mhz"
    assert f.sm_clock_drop_pct == pytest.approx(50.0)


def test_low_clock_without_reason_and_temperature_near_slowdown() -> None:
    n = 600
    clock = np.where(np.arange(n) >= 300, 1200.0, 1980.0)
    temp = np.where(np.arange(n) >= 500, 89.0, 60.0)
    g = _gpu(throttle_reasons=reasons.APPLICATIONS_CLOCKS_SETTING, sm_clock_mhz=clock, gpu_util_pct=90.0,
             temperature_c=temp)
    g.slowdown_temperature_c = 92.0
    found = {f.kind: f for f in gpu_findings(g)}
    assert set(found) == {"sm_clock_low", "temperature_near_slowdown"}
    assert found["sm_clock_low"].seconds == pytest.approx(300.0) and "application clocks" in found["sm_clock_low"].summary
    assert found["temperature_near_slowdown"].seconds == pytest.approx(100.0)
    assert found["temperature_near_slowdown"].slowdown_temperature_source == "nvml:temperature threshold SLOWDOWN"
    g.slowdown_temperature_c = None  # not in the catalogue for H100 either: skipped, not guessed
    assert "temperature_near_slowdown" not in {f.kind for f in gpu_findings(g)}


def test_xid_counters_and_flags() -> None:
    n = 600
    xid = np.full(n, np.nan)
    xid[200:] = 79.0
    xid[400:] = 48.0
    ecc_vol = np.where(np.arange(n) >= 250, 3.0, 1.0)
    ecc_agg = ecc_vol + 100  # the aggregate counts the same errors: one finding, from the volatile counter
    replay = np.concatenate([np.arange(300.0), np.zeros(300)])  # reset half-way: the rises still add up
    pending = np.where(np.arange(n) >= 590, 1.0, 0.0)
    g = _gpu(xid_last=xid, ecc_uncorrected_volatile=ecc_vol, ecc_uncorrected_total=ecc_agg, pcie_replay_total=replay,
             remapped_rows_pending=pending, nvlink_errors_total=5.0)
    found = {f.kind: f for f in gpu_findings(g)}
    assert set(found) == {"xid", "ecc_uncorrected", "pcie_replay", "row_remap_pending"}
    assert found["xid"].xids == [79, 48] and found["xid"].since_ts == T0 + 200
    assert found["ecc_uncorrected"].count == 2 and "volatile" in (found["ecc_uncorrected"].source or "")
    assert found["ecc_uncorrected"].severity == "critical"
    assert found["pcie_replay"].count == 299
    assert found["row_remap_pending"].seconds == pytest.approx(10.0)


def test_a_flag_read_every_30th_sample_holds_between_its_readings() -> None:
    n = 600
    pending = np.full(n, np.nan)
    pending[::30] = np.where(np.arange(0, n, 30) >= 300, 1.0, 0.0)  # the agent reads it every 30th sample
    remap = np.full(n, np.nan)
    remap[::30] = np.where(np.arange(0, n, 30) >= 300, 7.0, 4.0)
    found = {f.kind: f for f in gpu_findings(_gpu(retired_pages_pending=pending, remapped_rows_correctable=remap))}
    assert set(found) == {"retired_pages_pending", "row_remap"}
    flag = found["retired_pages_pending"]
    assert flag.seconds == pytest.approx(300.0) and flag.fraction == pytest.approx(0.5)
    assert (flag.since_ts, flag.until_ts) == (T0 + 300, T0 + 599)
    assert (found["row_remap"].count, found["row_remap"].since_ts) == (3, T0 + 300)
    assert hold_last(np.array([np.nan, 1.0, np.nan, 0.0, np.nan])).tolist()[1:] == [1.0, 1.0, 0.0, 0.0]
    assert np.isnan(hold_last(np.array([np.nan, 2.0]))[0])  # nothing read yet: unknown


def test_xid_already_there_at_the_start_is_not_new() -> None:
    assert gpu_findings(_gpu(xid_last=13.0)) == []
    assert counter_increase(np.array([np.nan, 4.0, 4.0])) == (0.0, None)


def test_columns_never_sent_give_no_findings() -> None:
    section = health_section([_gpu(gpu_util_pct=50.0)])
    assert section.findings == [] and section.gpus_checked == 1


def _dp_job(slow_from: int, slow_to: int, *, throttle: bool, gpus: int = 4, n: int = 1200) -> list[GpuSeries]:
    """Lock-step data parallel at 1 Hz, 10-s iterations: 6 s compute, then wait for the slowest, then 2 s
    all-reduce; GPU 1's compute lasts 8.5 s in [slow_from, slow_to)."""
    out = []
    t = np.arange(n, dtype=np.float64)
    for g in range(gpus):
        util = np.zeros(n)
        clock = np.full(n, 1980.0)
        r = np.zeros(n)
        start = 0.0
        while start < n:
            slow = slow_from <= start < slow_to
            compute = 8.5 if slow else 6.0
            mine = 8.5 if (slow and g == 1) else 6.0
            util[(t >= start) & (t < start + mine)] = 100.0
            util[(t >= start + compute) & (t < start + compute + 2.0)] = 100.0
            if slow and g == 1:
                span = (t >= start) & (t < start + compute + 2.0)
                clock[span] = 1400.0
                r[span] = reasons.SW_THERMAL_SLOWDOWN if throttle else 0
            start += compute + 2.0
        out.append(GpuSeries(uuid=f"GPU-{g}", name="NVIDIA H100 80GB HBM3", memory_total_bytes=None, ts=T0 + t,
                             columns={"gpu_util_pct": util, "sm_clock_mhz": clock, "throttle_reasons": r,
                                      "power_w": 100 + 5 * util}))
    return out


def test_straggler_named_with_when_how_much_and_cause() -> None:
    (s,) = nvml_stragglers(_dp_job(300, 900, throttle=True), period_s=10.0)
    assert s.gpu_uuid == "GPU-1" and s.rank is None
    assert s.likely_cause == "thermal throttling"
    assert 0.25 < s.slowdown_fraction < 0.45  # (8.5 + 2) / (6 + 2) - 1 = 0.31 of busy time per iteration
    assert s.median_step_s == pytest.approx(10.5, rel=0.05)  # the period while it straggled, not the job's 10.0
    assert T0 + 300 - 60 <= (s.since_ts or 0) <= T0 + 300 + 60 and T0 + 900 - 60 <= (s.until_ts or 0) <= T0 + 960


def test_straggler_without_reason_is_blamed_on_its_clock_and_no_straggler_in_lock_step() -> None:
    (s,) = nvml_stragglers(_dp_job(300, 900, throttle=False), period_s=10.0)
    assert s.likely_cause.startswith("lower SM clock")
    assert nvml_stragglers(_dp_job(0, 0, throttle=False), period_s=10.0) == []
    assert nvml_stragglers(_dp_job(300, 900, throttle=True)[:1], period_s=10.0) == []


def _job(**kw: object) -> JobData:
    base = dict(job_id="j", state="finished", name=None, team=None, started_at=None, ended_at=None, exit_code=None,
                batch_size=32, gpu_type_requested=None, gpus_requested=None, gpus=[_gpu(gpu_util_pct=90.0)],
                steps=None, layers=[])
    return JobData(**{**base, **kw})  # type: ignore[arg-type]


def test_mfu_from_hooks_then_estimate_else_null() -> None:
    hooks = _job(framework={"flops_per_step": 4.0e14, "flops_per_step_source": "torch.utils.flop_counter:step 1",
                            "precision": "bfloat16"})
    m = mfu_section(hooks, steps=100, step_time_mean_s=0.5, period_s=None)
    assert m.mfu_fraction == pytest.approx(4.0e14 * 2 / 989e12) and m.precision == "bf16"
    assert m.flops_per_step_source.startswith("hooks:") and m.peak_source == "catalogue:H100-80GB bf16 dense"
    est = _job(estimate={"flops_per_step": 1.0e12, "batch_size": 16, "precision": "fp32", "model_name": "resnet50"})
    m = mfu_section(est, steps=None, step_time_mean_s=None, period_s=0.25)
    assert m.flops_per_step == pytest.approx(2.0e12) and "scaled from batch 16 to 32" in (m.flops_per_step_source or "")
    assert m.mfu_fraction == pytest.approx(2.0e12 * 4 / 67e12) and m.steps_per_s_source.startswith("telemetry")
    none = mfu_section(_job(), steps=10, step_time_mean_s=1.0, period_s=None)
    assert none.mfu_fraction is None and none.flops_per_step is None and none.steps_per_s == 1.0


def test_the_synthetic_recording_plays_through_the_agents_replay_device() -> None:
    """The recording is in the format the agent's ReplayDevices reads (fleetprof JSONL), with the throttle schedule
    its generator wrote: GPU 2 reports thermal slowdown inside the throttled intervals only."""
    import json
    from pathlib import Path

    from agent.devices.replay import ReplayDevices
    from fleetprof.recordings import read_recording

    here = Path(__file__).resolve().parents[1] / "synthetic"
    truth = json.loads((here / "throttled_straggler.truth.json").read_text())
    clock = [0.0]
    dev = ReplayDevices(read_recording(here / "throttled_straggler.jsonl"), clock=lambda: clock[0], loop=False)
    slot = [g.uuid for g in dev.gpus()].index(truth["straggler_uuid"])
    (a, b), *_ = truth["throttle_intervals_s"]
    for t, throttled in ((a - 10, False), (a + 5, True), (b - 5, True), (b + 5, False)):
        clock[0] = t
        r = dev.read(slot).throttle_reasons or 0
        assert bool(r & (reasons.SW_THERMAL_SLOWDOWN | reasons.HW_THERMAL_SLOWDOWN)) is throttled, t
        assert not any((dev.read(s).throttle_reasons or 0) & reasons.SLOWDOWN_BITS
                       for s in range(len(dev.gpus())) if s != slot)


def test_idle_runs_and_goodput_terms_add_up() -> None:
    from server.analysis.fleet.goodput import goodput_terms, idle_runs

    util = np.array([0, 0, 0, 50, 0, 0, 100, np.nan, 0, 0, 0, 0], dtype=np.float64)
    dur = np.full(util.size, 30.0)
    assert idle_runs(util, dur).tolist() == [True, True, True, False, True, True, False, False,
                                              True, True, True, True]  # runs of 90, 60 and 120 s; >= 60 s
    assert idle_runs(util, dur, min_run_s=61).tolist()[4:6] == [False, False]
    terms = goodput_terms(util, dur, throttled=util == 100, idle_run=None)
    total = sum(terms.values())
    assert np.allclose(total[~np.isnan(util)], 30.0) and total[7] == 0.0  # unknown utilization: no bucket
    assert terms["throttled_s"][6] == 30.0 and terms["stalled_s"][3] == 15.0 and terms["productive_s"][3] == 15.0


def test_straggler_when_peers_wait_busy_in_a_spinning_collective() -> None:
    """Every GPU at 100 % utilization all the time (peers spin in NCCL while they wait): GPU 1 throttled to 1400 of
    1980 MHz in [300, 900) is named from its clock against its peers', with the compute-bound estimate."""
    gpus = _dp_job(300, 900, throttle=True)
    for g in gpus:
        g.columns["gpu_util_pct"] = np.full(g.ts.size, 100.0)
    (s,) = nvml_stragglers(gpus, period_s=10.0)
    assert s.gpu_uuid == "GPU-1" and s.likely_cause == "thermal throttling"
    assert s.slowdown_fraction == pytest.approx(1980 / 1400 - 1, rel=0.02)
    assert "compute-bound estimate" in (s.source or "") and s.busy_phase_s is None
    assert T0 + 300 - 60 <= (s.since_ts or 0) <= T0 + 360
    for g in gpus:  # the same clocks everywhere: nobody to name
        g.columns["sm_clock_mhz"] = np.full(g.ts.size, 1980.0)
    assert nvml_stragglers(gpus, period_s=10.0) == []
