"""GPM metrics, health counters and identity facts (issue #20) through NvmlDevices and the sampler, against the
pynvml test double: supported, unsupported, their cadences and their error mapping; and through a replay."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from agent.devices.replay import ReplayDevices
from fleetprof.protocol import GPM_FIELDS, HEALTH_COUNTER_FIELDS, PROTOCOL_VERSION, GpuInfo, SampleBatch, SampleColumns
from fleetprof.recordings import dump_batch_line, read_recording
from tests.agent.conftest import make_fake
from tests.agent.test_devices_nvml import sampler_for

SM, TENSOR = pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC


def _gpm_fake() -> FakeNvml:
    fake = make_fake(2)
    fake.gpus[0].gpm_supported = True  # Hopper; GPU 1 is older (GPM off, the double's default)
    return fake


def test_gpm_from_two_samples_one_reading_apart_and_null_without_gpm() -> None:
    fake = _gpm_fake()
    dev = NvmlDevices(fake, xid_events=False)
    g = fake.gpus[0]
    values = []
    for k in range(4):
        g.gpm_metrics[SM], g.gpm_metrics[TENSOR], g.gpm_metrics[PCIE_TX] = 10.0 * k, 5.0 * k, 2.0 * k
        r = dev.read(0)
        values.append((r.gpm_sm_activity_pct, r.gpm_tensor_activity_pct, r.gpm_pcie_tx_bytes_per_s))
    # the first reading has no earlier sample; each later one covers the interval ending at its own sample
    assert values[0] == (None, None, None)
    assert values[1:] == [(10.0 * k, 5.0 * k, 2.0 * k * 1024 * 1024) for k in (1, 2, 3)]  # MiB/s -> bytes/s
    assert fake.calls["nvmlGpmSampleGet"] == 4 and fake.calls["nvmlGpmMetricsGet"] == 3  # one sample per reading
    other = dev.read(1)
    assert all(getattr(other, f) is None for f in GPM_FIELDS)
    assert fake.calls["nvmlGpmSampleGet"] == 4  # GPU 1 is not sampled


def test_gpm_metric_a_gpu_lacks_is_null_the_others_known() -> None:
    fake = _gpm_fake()
    del fake.gpus[0].gpm_metrics[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC]
    dev = NvmlDevices(fake, xid_events=False)
    dev.read(0)
    r = dev.read(0)
    assert r.gpm_nvlink_tx_bytes_per_s is None and r.gpm_nvlink_rx_bytes_per_s == 0.0
    assert r.gpm_sm_activity_pct == pytest.approx(96.47)


def test_gpm_not_supported_at_sampling_maps_to_null_and_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    fake = _gpm_fake()
    dev = NvmlDevices(fake, xid_events=False)
    dev.read(0)
    fake.gpus[0].unsupported.add("nvmlGpmSampleGet")  # NVML_ERROR_NOT_SUPPORTED -> FieldNotSupportedError -> None
    with caplog.at_level("INFO"):
        r = dev.read(0)
        dev.read(0)
    assert r.gpm_sm_activity_pct is None and r.memory_used_bytes is not None  # the rest of the reading stands
    assert fake.calls["nvmlGpmSampleGet"] == 2  # not asked again
    assert sum("gpm not supported" in m for m in caplog.messages) == 1


def test_gpm_transient_error_restarts_the_pair() -> None:
    fake = _gpm_fake()
    dev = NvmlDevices(fake, xid_events=False)
    dev.read(0)
    dev.read(0)
    real = fake.nvmlGpmSampleGet
    fake.nvmlGpmSampleGet = lambda h, s: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT))  # type: ignore[method-assign]
    assert dev.read(0).gpm_sm_activity_pct is None
    fake.nvmlGpmSampleGet = real  # type: ignore[method-assign]
    assert dev.read(0).gpm_sm_activity_pct is None  # a new first sample: no interval yet
    assert dev.read(0).gpm_sm_activity_pct == pytest.approx(96.47)


def test_mig_devices_have_no_gpm_of_their_own() -> None:
    parent = FakeGpu(uuid="GPU-parent", gpm_supported=True,
                     mig_devices=[FakeGpu(uuid="MIG-a", is_mig=True, gpm_supported=True)])
    dev = NvmlDevices(FakeNvml([parent]), xid_events=False)
    assert [i.uuid for i in dev.gpus()] == ["GPU-parent", "MIG-a"]
    for _ in range(2):
        mig, parent_reading = dev.read(1), dev.read(0)
    assert mig.gpm_sm_activity_pct is None and parent_reading.gpm_sm_activity_pct is not None
    assert dev.gpus()[1].max_sm_clock_mhz is None  # the parent's


def test_identity_facts() -> None:
    fake = make_fake(1, max_sm_clock_mhz=1755, slowdown_temperature_c=87)
    ident = NvmlDevices(fake, xid_events=False).gpus()[0]
    assert (ident.max_sm_clock_mhz, ident.slowdown_temperature_c) == (1755.0, 87.0)
    fake = make_fake(1, unsupported={"nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetTemperatureThreshold"})
    ident = NvmlDevices(fake, xid_events=False).gpus()[0]
    assert (ident.max_sm_clock_mhz, ident.slowdown_temperature_c) == (None, None)


def test_health_counters_at_their_cadence_and_unsupported_ones_null() -> None:
    fake = make_fake(1, unsupported={"nvmlDeviceGetRetiredPages"})  # as an H100: rows are remapped instead
    g = fake.gpus[0]
    g.ecc_corrected, g.ecc_corrected_volatile, g.ecc_uncorrected_volatile = 9, 3, 1
    g.remapped_rows_correctable, g.remapped_rows_pending = 2, True
    g.pcie_replay = 7
    g.nvlink_links = 4
    g.nvlink_errors = {(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 4, (3, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY): 1,
                       (2, pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA): 100}  # not one of the four summed
    dev = NvmlDevices(fake, xid_events=False, health_every=3)
    readings = [dev.read(0) for _ in range(4)]
    first = readings[0]
    assert first.ecc_corrected_total == 9  # aggregate, every reading
    assert (first.ecc_corrected_volatile, first.ecc_uncorrected_volatile) == (3, 1)
    assert (first.remapped_rows_correctable, first.remapped_rows_uncorrectable, first.remapped_rows_pending,
            first.remapped_rows_failed) == (2, 0, 1, 0)
    assert first.pcie_replay_total == 7 and first.nvlink_errors_total == 5
    assert first.retired_pages_sbe is None and first.retired_pages_pending is None
    # in between: null (not read), the aggregate ECC count still there
    assert all(getattr(readings[1], f) is None for f in HEALTH_COUNTER_FIELDS)
    assert readings[1].ecc_corrected_total == 9
    assert readings[3].pcie_replay_total == 7  # due again (every 3 readings, staggered by slot 0)


def test_retired_pages_counted_and_an_unkept_nvlink_counter_left_out() -> None:
    fake = make_fake(1, retired_pages_sbe=2, retired_pages_dbe=1, retired_pages_pending=True,
                     unsupported={f"nvlink_errors:{pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT}"})
    g = fake.gpus[0]
    g.nvlink_links = 2
    g.nvlink_errors = {(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 50, (1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 3}
    r = NvmlDevices(fake, xid_events=False).read(0)
    assert (r.retired_pages_sbe, r.retired_pages_dbe, r.retired_pages_pending) == (2, 1, 1)
    assert r.nvlink_errors_total == 3
    fake = make_fake(1)
    fake.gpus[0].nvlink_links = 0
    assert NvmlDevices(fake, xid_events=False).read(0).nvlink_errors_total is None  # no NVLink: unknown, not 0


def test_sampler_ships_the_new_columns_and_gpu_facts() -> None:
    fake = _gpm_fake()
    fake.gpus[0].pcie_replay = 11
    dev = NvmlDevices(fake, xid_events=False)
    s = sampler_for(dev)
    s.sample()
    s.sample()
    batch = s.make_batch()
    assert batch is not None
    c = batch.samples
    # row order: (reading 1: GPU 0, GPU 1), (reading 2: GPU 0, GPU 1)
    assert c.gpm_sm_activity_pct == [None, None, pytest.approx(96.47), None]
    assert c.gpm_pcie_rx_bytes_per_s is not None and c.gpm_pcie_rx_bytes_per_s[2] == pytest.approx(16084622.35)
    # health counters at the first reading, then staggered: GPU 1 is due again at its second reading, GPU 0 not
    assert c.pcie_replay_total == [11, 0, None, 0]
    assert batch.gpus[0].max_sm_clock_mhz == 1980.0 and batch.gpus[0].slowdown_temperature_c == 90.0
    again = SampleBatch.model_validate_json(batch.model_dump_json())  # the wire round trip
    assert again.samples.gpm_sm_activity_pct == c.gpm_sm_activity_pct


def test_protocol_bounds_of_the_new_columns() -> None:
    base = {"ts": [1_800_000_000.0], "gpu_uuid": ["GPU-x"]}
    SampleColumns(**base, gpm_sm_activity_pct=[100.0], remapped_rows_pending=[1], nvlink_errors_total=[None])
    for bad in ({"gpm_sm_activity_pct": [100.5]}, {"gpm_dram_bw_util_pct": [-1.0]}, {"remapped_rows_failed": [2]},
                {"pcie_replay_total": [-3]}, {"retired_pages_sbe": [1.0]}, {"gpm_pcie_tx_bytes_per_s": ["5"]}):
        with pytest.raises(ValueError):
            SampleColumns(**base, **bad)


def test_a_recording_replays_its_gpm_and_health_columns_and_absent_ones_are_none(tmp_path: Path) -> None:
    t0 = 1_780_000_000.0
    gpus = [GpuInfo(uuid="GPU-r0", index=0, name="NVIDIA H100 80GB HBM3", max_sm_clock_mhz=1980.0,
                    slowdown_temperature_c=90.0)]
    cols = SampleColumns(ts=[t0, t0 + 1], gpu_uuid=["GPU-r0"] * 2, gpm_sm_activity_pct=[40.0, 60.0],
                         gpm_tensor_activity_pct=[None, 30.0], remapped_rows_correctable=[1, 1])
    path = tmp_path / "rec.jsonl"
    path.write_text(dump_batch_line(SampleBatch(protocol_version=PROTOCOL_VERSION, node="n", agent_id="a", seq=1,
                                                sent_at=t0 + 1, gpus=gpus, samples=cols)) + "\n")
    now = [0.0]
    dev = ReplayDevices(read_recording(path), clock=lambda: now[0], loop=False)
    assert dev.gpus()[0].max_sm_clock_mhz == 1980.0 and dev.gpus()[0].slowdown_temperature_c == 90.0
    r = dev.read(0)
    assert (r.gpm_sm_activity_pct, r.gpm_tensor_activity_pct, r.remapped_rows_correctable) == (40.0, None, 1)
    assert r.pcie_replay_total is None and r.gpm_dram_bw_util_pct is None  # not in the recording
    now[0] = 1.0
    assert dev.read(0).gpm_tensor_activity_pct == 30.0


def test_a_gpm_gpu_takes_its_pcie_and_nvlink_rates_from_gpm_every_reading() -> None:
    fake = _gpm_fake()
    g0 = fake.gpus[0]
    g0.gpm_metrics[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = 100.0  # MiB/s
    asked: list[list[object]] = []
    real = fake.nvmlDeviceGetFieldValues

    def field_values(h, ids):  # type: ignore[no-untyped-def]
        if h.gpu is g0:
            asked.append(list(ids))
        return real(h, ids)

    fake.nvmlDeviceGetFieldValues = field_values  # type: ignore[method-assign]
    dev = NvmlDevices(fake, xid_events=False, slow_every=1)  # the PCIe window would be due at every reading
    first, second = dev.read(0), dev.read(0)
    assert first.pcie_tx_kib_per_s is None and first.nvlink_tx_kib_per_s is None  # no GPM interval yet
    assert second.pcie_tx_kib_per_s == pytest.approx(5516329.96 / 1024)
    assert second.nvlink_tx_kib_per_s == pytest.approx(100.0 * 1024)
    assert fake.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    nvlink_data = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
    assert not any(isinstance(f, tuple) and f[0] in nvlink_data for ids in asked for f in ids)
    # GPU 1 has no GPM: the 20 ms PCIe window and the per-link counters, as before
    other = dev.read(1)
    assert other.pcie_tx_kib_per_s == 1000 and fake.calls["nvmlDeviceGetPcieThroughput"] == 2
