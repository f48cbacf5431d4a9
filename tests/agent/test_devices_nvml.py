"""NvmlDevices against the pynvml test double (the whole module is replaced: no GPU needed)."""

from __future__ import annotations

import logging
import sys

import pynvml
import pytest

from agent.attribution import Attribution
from agent.devices.base import DevicePermissionError, DeviceUnavailableError, FieldNotSupportedError, GpuLostError
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices, map_nvml_error
from agent.sampler import Sampler
from tests.agent.conftest import make_fake


class NoAttribution:
    def attribute(self, pid: int, gpu_uuid: str | None = None) -> Attribution:
        return Attribution(f"job-{pid}", "env:FLEETPROF_JOB_ID")

    def forget_except(self, pids: set[int]) -> None:
        pass


def sampler_for(devices: NvmlDevices, clock_start: float = 1_800_000_000.0) -> Sampler:
    t = iter(range(10_000))
    return Sampler(devices, node="n1", agent_id="n1-test", attributor=NoAttribution(),  # type: ignore[arg-type]
                   clock=lambda: clock_start + next(t))


def test_normal_sampling_units_and_inventory(fake_nvml: FakeNvml) -> None:
    g = fake_nvml.gpus[0]
    g.memory_used_bytes, g.power_mw, g.energy_mj = 10 << 30, 250_000, 5_000_000
    g.compute_processes = [(4242, 3 << 30)]
    g.graphics_processes = [(4242, 3 << 30), (4343, None)]
    dev = NvmlDevices(fake_nvml)
    assert fake_nvml.initialised == 1
    facts = dev.node_facts()
    assert (facts.driver_version, facts.cuda_version, facts.nvml_version) == ("550.54.15", "12.4", "12.550.54.15")
    ids = dev.gpus()
    assert [i.uuid for i in ids] == [g.uuid for g in fake_nvml.gpus]
    assert ids[0].power_source == "field:NVML_FI_DEV_POWER_AVERAGE"  # the driver's 1-s mean, where it has one
    assert ids[0].pci_bus_id == "00000000:18:00.0" and ids[0].memory_total_bytes == 85_520_809_984

    s = sampler_for(dev)
    s.tick_fast()
    s.sample()
    batch = s.make_batch(dropped_samples_total=3, clock_skew_s=0.25)
    assert batch is not None
    c = batch.samples
    assert c.gpu_uuid == [g.uuid for g in fake_nvml.gpus] and c.healthy == [True, True]
    assert c.memory_used_bytes is not None and c.memory_used_bytes[0] == 10 << 30
    assert c.memory_reserved_bytes == [502_267_904] * 2
    assert c.power_w == [250.0, 300.0] and c.power_max_w == [250.0, 300.0]
    assert c.energy_counter_j == [5000.0, 1000.0]  # mJ -> J at the edge
    assert c.pcie_tx_bytes_per_s == [1000 * 1024.0] * 2
    assert c.gpu_util_pct == [50.0, 50.0] and c.sm_clock_mhz == [1980.0, 1980.0]
    assert c.ecc_corrected_total == [0, 0] and c.xid_last is None
    assert batch.gpus[0].power_limit_w == 700.0 and batch.node_info and batch.node_info.driver_version
    assert batch.dropped_samples_total == 3 and batch.clock_skew_s == 0.25 and batch.seq == 1
    p = batch.processes
    assert p is not None and sorted(zip(p.pid, p.used_memory_bytes)) == [(4242, 3 << 30), (4343, None)]
    assert p.job_id[0] == f"job-{p.pid[0]}"
    assert s.make_batch() is None  # nothing new


def test_nvlink_rates_from_counter_deltas(fake_nvml: FakeNvml) -> None:
    now = [100.0]
    dev = NvmlDevices(fake_nvml, clock=lambda: now[0])
    assert dev.read(0).nvlink_tx_kib_per_s is None  # the first reading only sets the baseline
    g = fake_nvml.gpus[0]
    g.nvlink_tx_kib, g.nvlink_rx_kib = 18 * 1000, 18 * 500
    now[0] = 102.0
    r = dev.read(0)
    assert r.nvlink_tx_kib_per_s == 9000.0 and r.nvlink_rx_kib_per_s == 4500.0


def test_peaks_between_samples_are_kept() -> None:
    fake = make_fake(1)
    g = fake.gpus[0]
    s = sampler_for(NvmlDevices(fake, power_instant_10hz=True))  # instantaneous power at every fast reading
    for used, power in ((1 << 30, 100_000), (9 << 30, 400_000), (1 << 30, 100_000)):
        g.memory_used_bytes, g.power_mw = used, power
        s.tick_fast()
    s.sample()  # the full reading sees 1 GiB: the 9 GiB spike lives on in the max
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.memory_used_max_bytes == [9 << 30]
    assert c.memory_used_bytes == [(12 << 30) // 4]
    assert c.power_max_w == [400.0] and c.power_w == [175.0]


def test_busy_gpu_spike_between_shipping_intervals_is_caught_at_10_hz() -> None:
    """In the steady state (several full readings done), a GPU with a process is read at every fast tick: a
    memory spike that starts and ends between two full readings is in that interval's max, not in the next."""
    fake = make_fake(1, compute_processes=[(4242, 2 << 30)])
    g = fake.gpus[0]
    s = sampler_for(NvmlDevices(fake))
    for _ in range(3):  # steady state: memory unchanged across full readings, as an idle GPU's would be
        for _ in range(9):
            s.tick_fast()
        s.sample()
    s.make_batch()
    for tick in range(9):
        g.memory_used_bytes = (30 << 30) if tick == 4 else (1 << 30)  # one tick of 100 ms at 30 GiB
        s.tick_fast()
    s.sample()
    for _ in range(9):
        s.tick_fast()
    s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.memory_used_max_bytes == [30 << 30, 1 << 30]
    assert c.memory_used_bytes == [(8 * (1 << 30) + (30 << 30) + (1 << 30)) // 10, 1 << 30]


def test_idle_gpu_skips_fast_ticks_until_a_process_appears() -> None:
    """No process and memory unchanged since the previous full reading: no 10 Hz NVML reads until the next full
    reading; a process listed there (or memory that moved) brings the ticks back, and their peaks."""
    fake = make_fake(2)
    fake.gpus[0].compute_processes = [(4242, 2 << 30)]  # GPU 0 busy, GPU 1 idle
    idle = fake.gpus[1]
    s = sampler_for(NvmlDevices(fake))
    s.sample()
    s.sample()  # the second full reading sees GPU 1 with no process and the same memory: idle
    s.make_batch()
    before = fake.calls.get("nvmlDeviceGetMemoryInfo", 0)
    for _ in range(9):
        s.tick_fast()
    assert fake.calls["nvmlDeviceGetMemoryInfo"] - before == 9  # GPU 0's only
    idle.memory_used_bytes = 5 << 30  # memory moved with no process listed (yet)
    s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.memory_used_bytes == [1 << 30, 5 << 30]  # the idle GPU's row: its full reading's value
    before = fake.calls["nvmlDeviceGetMemoryInfo"]
    idle.compute_processes = [(4343, 8 << 30)]
    for tick in range(9):  # memory changed at the last full reading: ticked again
        idle.memory_used_bytes = (12 << 30) if tick == 2 else (5 << 30)
        s.tick_fast()
    assert fake.calls["nvmlDeviceGetMemoryInfo"] - before == 18
    s.sample()
    for _ in range(3):  # a process is listed now: still ticked though memory is unchanged
        s.tick_fast()
    s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.memory_used_max_bytes[1::2] == [12 << 30, 5 << 30]
    assert fake.calls["nvmlDeviceGetMemoryInfo"] - before == 18 + 2 + 6 + 2


def test_unsupported_field_is_null_logged_once_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    fake = make_fake(2)
    fake.gpus[1].unsupported = {"nvmlDeviceGetPcieThroughput", "energy", "power_average", "power_instant", "ecc"}
    fake.gpus[1].nvlink_links = 0
    dev = NvmlDevices(fake, slow_every=1)  # PCIe and energy at every reading
    assert dev.gpus()[1].power_source == "nvmlDeviceGetPowerUsage"  # falls back from both power fields
    s = sampler_for(dev)
    with caplog.at_level(logging.INFO, logger="agent.devices.nvml"):
        for _ in range(3):
            s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.pcie_tx_bytes_per_s == [1024000.0, None] * 3
    assert c.energy_counter_j == [1000.0, None] * 3
    assert c.ecc_uncorrected_total == [0, None] * 3
    assert c.power_w == [300.0, 300.0] * 3 and c.healthy == [True] * 6
    msgs = [r.getMessage() for r in caplog.records if fake.gpus[1].uuid in r.getMessage()]
    assert sum("pcie_tx" in m for m in msgs) == 1 and sum("energy" in m for m in msgs) == 1
    pcie_calls = fake.calls["nvmlDeviceGetPcieThroughput"]
    s.sample()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == pcie_calls + 2  # only GPU 0 (tx + rx)


def test_lost_gpu_is_unhealthy_others_keep_sampling_and_it_can_come_back(caplog: pytest.LogCaptureFixture) -> None:
    fake = make_fake(3)
    dev = NvmlDevices(fake)
    s = sampler_for(dev)
    s.sample()
    fake.gpus[1].lost = True
    with caplog.at_level(logging.ERROR):
        s.tick_fast()
        s.sample()
        s.tick_fast()
        s.sample()
    assert sum("marked unhealthy" in r.getMessage() for r in caplog.records) == 1
    fake.gpus[1].lost = False
    s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.healthy == [True] * 3 + [True, False, True] * 2 + [True] * 3
    assert c.memory_used_bytes is not None and c.memory_used_bytes[4] is None and c.memory_used_bytes[3] == 1 << 30
    assert c.memory_total_bytes is not None and c.memory_total_bytes[4] == 85_520_809_984  # static fact kept
    assert c.power_w is not None and c.power_w[5] == 300.0


def test_gpu_lost_at_start_up_keeps_its_slot() -> None:
    fake = make_fake(2)
    fake.gpus[0].lost = True
    fake.gpus[0].uuid = "GPU-lost"
    # the UUID query itself fails on a lost GPU in real life; the double answers it so the slot has a name
    fake.nvmlDeviceGetUUID = lambda h: h.gpu.uuid  # type: ignore[method-assign]
    dev = NvmlDevices(fake)
    assert [g.uuid for g in dev.gpus()] == ["GPU-lost", fake.gpus[1].uuid]
    with pytest.raises(GpuLostError):
        dev.read(0)
    assert dev.read(1).memory_used_bytes == 1 << 30


def test_mig_devices_are_slots_of_their_own() -> None:
    migs = [FakeGpu(uuid=f"MIG-{i}", name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", memory_total_bytes=10 << 30,
                    memory_used_bytes=(i + 1) << 28, is_mig=True, compute_processes=[(500 + i, 1 << 28)],
                    gpu_instance_id=7 + i,
                    unsupported={"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                                 "nvmlDeviceGetPcieThroughput"})
            for i in range(2)]
    parent = FakeGpu(uuid="GPU-parent", mig_devices=migs)
    fake = FakeNvml([parent, FakeGpu(uuid="GPU-plain")])
    dev = NvmlDevices(fake)
    ids = dev.gpus()
    assert [(g.uuid, g.index, g.mig_parent_uuid) for g in ids] == [
        ("GPU-parent", 0, None), ("MIG-0", 0, "GPU-parent"), ("MIG-1", 0, "GPU-parent"), ("GPU-plain", 1, None)]
    assert ids[1].power_source is None and ids[1].memory_total_bytes == 10 << 30
    assert [(g.mig_gpu_instance_id, g.mig_profile) for g in ids] == [(None, None), (7, "1g.10gb"), (8, "1g.10gb"),
                                                                     (None, None)]
    s = sampler_for(dev)
    s.sample()
    b = s.make_batch()
    assert b is not None
    assert b.samples.memory_used_bytes == [1 << 30, 1 << 28, 2 << 28, 1 << 30]
    assert b.samples.power_w == [300.0, None, None, 300.0]
    assert b.samples.energy_counter_j == [1000.0, None, None, 1000.0]
    assert b.processes is not None and sorted(zip(b.processes.gpu_uuid, b.processes.pid)) == [
        ("MIG-0", 500), ("MIG-1", 501)]
    assert [g.mig_parent_uuid for g in b.gpus] == [None, "GPU-parent", "GPU-parent", None]


def test_xid_events_become_xid_last(fake_nvml: FakeNvml) -> None:
    s = sampler_for(NvmlDevices(fake_nvml))
    fake_nvml.xid(1, 79)
    s.sample()
    s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.xid_last == [None, 79, None, 79]


def test_v1_memory_fallback_on_old_driver() -> None:
    fake = make_fake(1)
    fake.gpus[0].unsupported = {"nvmlDeviceGetMemoryInfo_v2"}
    r = NvmlDevices(fake).read(0)
    assert r.memory_reserved_bytes is None and r.memory_used_bytes == (1 << 30) + 502_267_904


def test_error_mapping_and_init_failure() -> None:
    assert isinstance(map_nvml_error(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), 3), GpuLostError)
    assert isinstance(map_nvml_error(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)),
                      FieldNotSupportedError)
    assert isinstance(map_nvml_error(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)),
                      DevicePermissionError)

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with pytest.raises(DeviceUnavailableError, match="cannot be initialised"):
        NvmlDevices(Broken([]))


def test_pynvml_is_imported_lazily_and_can_be_patched_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake(1)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    dev = NvmlDevices()
    assert dev.gpus()[0].uuid == fake.gpus[0].uuid
    dev.close()
    dev.close()
    assert fake.initialised == 0


def test_every_sample_carries_the_enforced_power_limit_and_application_clocks() -> None:
    """Read at every full reading, not once at start-up: a cap set during the job (nvidia-smi -pl) shows."""
    fake = make_fake(2)
    a, b = fake.gpus
    b.unsupported.add("nvmlDeviceGetApplicationsClock")
    s = sampler_for(NvmlDevices(fake, static_every=1))
    s.sample()
    a.power_limit_mw = 450_000  # capped between two readings
    a.app_sm_clock_mhz = 1410
    s.sample()
    batch = s.make_batch()
    assert batch is not None and batch.source == "nvml"  # the double stands in for pynvml; the daemon's fake:N
    c = batch.samples                                        # source labels its batches "test"
    assert c.power_limit_w == [700.0, 700.0, 450.0, 700.0]  # mW -> W at the edge
    assert c.app_sm_clock_mhz == [1755.0, None, 1410.0, None]  # unsupported on GPU b: null, the sample stays
    assert c.app_mem_clock_mhz == [2619.0, None, 2619.0, None]


def test_cadences_fast_interval_and_slow_fields() -> None:
    """10 Hz: memory and power only. Every reading: the cheap fields and the enforced limit. Every
    `slow_every` readings (staggered by GPU, and at the first): energy and PCIe, null in between. Every
    `static_every`: application clocks, the last value read on every row."""
    fake = make_fake(2)
    now = [0.0]
    dev = NvmlDevices(fake, slow_every=3, static_every=4, clock=lambda: now[0])
    dev.read(0), dev.read(1)  # the interval's reading reads the driver's 1-s power mean
    before = dict(fake.calls)
    for _ in range(5):
        now[0] += 0.1
        dev.read_fast(0)
        dev.read_fast(1)
    fast = {k: v - before.get(k, 0) for k, v in fake.calls.items() if v != before.get(k, 0)}
    assert fast == {"nvmlDeviceGetMemoryInfo": 10}  # the power mean read at the reading still covers them
    instant = make_fake(2)
    dev_instant = NvmlDevices(instant, power_instant_10hz=True)
    before = dict(instant.calls)
    for _ in range(5):
        dev_instant.read_fast(0)
        dev_instant.read_fast(1)
    fast = {k: v - before.get(k, 0) for k, v in instant.calls.items() if v != before.get(k, 0)}
    assert fast == {"nvmlDeviceGetMemoryInfo": 10, "nvmlDeviceGetFieldValues": 10}  # power: the instant field
    fake.calls.clear()
    now[0] = 0.0
    dev = NvmlDevices(fake, slow_every=3, static_every=4, clock=lambda: now[0])
    s = sampler_for(dev)
    a = fake.gpus[0]
    for i in range(8):
        if i == 2:
            a.app_sm_clock_mhz = 1410  # set by an administrator: seen at the next refresh (reading 4 of GPU 0)
        s.sample()
    c = s.make_batch().samples  # type: ignore[union-attr]
    rows = range(0, 16, 2), range(1, 16, 2)
    energy = [[c.energy_counter_j[i] for i in r] for r in rows]  # type: ignore[index]
    pcie = [[c.pcie_tx_bytes_per_s[i] for i in r] for r in rows]  # type: ignore[index]
    # GPU 0: readings 0, 3, 6; GPU 1: 0 (the first), 1, 4, 7
    assert energy == [[1000.0, None, None, 1000.0, None, None, 1000.0, None],
                      [1000.0, 1000.0, None, None, 1000.0, None, None, 1000.0]]
    assert pcie == [[1024000.0 if v is not None else None for v in row] for row in energy]
    assert [c.app_sm_clock_mhz[i] for i in rows[0]] == [1755.0] * 4 + [1410.0] * 4  # type: ignore[index]
    assert c.power_limit_w == [700.0] * 16 and c.temperature_c == [55.0] * 16
    assert fake.calls["nvmlDeviceGetApplicationsClock"] == 2 * (2 + 3)  # GPU 0: 0, 4; GPU 1: 0, 1, 5 (SM + memory)


def test_fast_reading_steady_path_sees_changes_and_falls_back_on_errors() -> None:
    fake = make_fake(1)
    g = fake.gpus[0]
    dev = NvmlDevices(fake, power_instant_10hz=True)
    assert dev.read_fast(0) == (1 << 30, 300_000)  # careful path; the steady one is built after it
    g.memory_used_bytes, g.power_instant_mw = 5 << 30, 420_000
    assert dev.read_fast(0) == (5 << 30, 420_000)
    g.lost = True
    with pytest.raises(GpuLostError):
        dev.read_fast(0)
    g.lost = False
    assert dev.read_fast(0) == (5 << 30, 420_000)  # handle back by UUID
    g.unsupported.add("power_instant")  # the field stops answering: null power, memory still read
    assert dev.read_fast(0) == (5 << 30, None)
    assert dev.read_fast(0) == (5 << 30, None)


def test_driver_power_mean_is_read_once_a_second_and_covers_longer_intervals() -> None:
    """Where the GPU has NVML_FI_DEV_POWER_AVERAGE (the driver's 1-s mean) the fast readings read memory only,
    and power once a second: an interval's power_w is the mean of the 1-s means read in it, power_max_w the
    highest of them."""
    fake = make_fake(1, compute_processes=[(4242, 2 << 30)])
    g = fake.gpus[0]
    now = [0.0]
    dev = NvmlDevices(fake, clock=lambda: now[0])
    assert dev.gpus()[0].power_source == "field:NVML_FI_DEV_POWER_AVERAGE"
    s = sampler_for(dev)
    g.power_mw = 200_000
    s.sample()  # t = 0: the previous interval's
    s.make_batch()

    def run_interval(seconds: int, watts_by_second: list[int]) -> None:
        for tick in range(1, seconds * 10):
            now[0] += 0.1
            if tick % 10 == 0:
                g.power_mw = watts_by_second[tick // 10 - 1] * 1000
            s.tick_fast()
        now[0] += 0.1
        g.power_mw = watts_by_second[-1] * 1000
        s.sample()

    fields = fake.calls["nvmlDeviceGetFieldValues"]
    run_interval(1, [300])  # 1-s interval: only the interval's reading reads power
    assert fake.calls["nvmlDeviceGetFieldValues"] - fields == 1
    run_interval(3, [300, 450, 600])  # 3-s interval: the fast readings at 1 s and 2 s read it too
    c = s.make_batch().samples  # type: ignore[union-attr]
    assert c.power_w == [300.0, 450.0] and c.power_max_w == [300.0, 600.0]
    assert fake.calls["nvmlDeviceGetFieldValues"] - fields == 1 + 3
    assert fake.calls["nvmlDeviceGetMemoryInfo"] > 35  # memory still at every fast reading


def test_driver_power_mean_errors_take_the_careful_path() -> None:
    fake = make_fake(1)
    g = fake.gpus[0]
    now = [0.0]
    dev = NvmlDevices(fake, clock=lambda: now[0])
    assert dev.read_fast(0) == (1 << 30, 300_000)  # careful path, due at the first reading
    now[0] += 0.5
    g.memory_used_bytes, g.power_mw = 5 << 30, 420_000
    assert dev.read_fast(0) == (5 << 30, None)  # steady path, not due
    now[0] += 0.5
    assert dev.read_fast(0) == (5 << 30, 420_000)
    now[0] += 1.0
    g.lost = True
    with pytest.raises(GpuLostError):
        dev.read_fast(0)
    g.lost = False
    assert dev.read_fast(0) == (5 << 30, 420_000)  # handle back by UUID; due again after the revival
    g.unsupported.add("power_average")  # the field stops answering: null power, memory still read, not asked again
    now[0] += 1.0
    assert dev.read_fast(0) == (5 << 30, None)
    fields = fake.calls["nvmlDeviceGetFieldValues"]
    for _ in range(20):
        now[0] += 0.5
        assert dev.read_fast(0) == (5 << 30, None)
    assert fake.calls["nvmlDeviceGetFieldValues"] == fields


def test_instantaneous_power_where_the_driver_has_no_mean_or_when_asked() -> None:
    fake = make_fake(2)
    fake.gpus[1].unsupported = {"power_average"}
    assert [i.power_source for i in NvmlDevices(fake).gpus()] == ["field:NVML_FI_DEV_POWER_AVERAGE",
                                                                  "field:NVML_FI_DEV_POWER_INSTANT"]
    assert [i.power_source for i in NvmlDevices(fake, power_instant_10hz=True).gpus()] == \
        ["field:NVML_FI_DEV_POWER_INSTANT"] * 2
