"""A test double for the whole `pynvml` module (Zeus style), with per-call latencies measured on an H100.

`NvmlDevices(FakeNvml(...))` runs the real NVML code path on a machine without a GPU: the unit tests use it
with zero latency, the overhead benchmark with `DEFAULT_LATENCIES_S`. Error classes and constants are the
real `pynvml` ones (pure Python; importing pynvml loads no library until nvmlInit), so the error mapping is
tested against what the driver raises.

Latencies (`DEFAULT_LATENCIES_S`): the medians of 200 calls on an NVIDIA H100 80GB HBM3, driver 580.159.04,
in bench/results/nvml_probe_h100.json (`bench/nvml_probe.py`). Calls that file does not cover were timed the
same way on the same H100 and driver with a throw-away probe (time.perf_counter and time.thread_time around
each call): nvmlDeviceGetFieldValues (one call, its cost by field: `FIELD_LATENCIES_S`),
nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetGraphicsRunningProcesses and nvmlEventSetWait. The calls in
neither (nvmlInit, UUID, name, PCI info, MIG queries, power-limit constraints) keep the assumed
`DEFAULT_LATENCY_S` / 0.3 s of nvmlInit: unmeasured.

Latency model: each call takes its latency, of which a share is spent spinning (on the thread's CPU clock)
to stand for the CPU time of the ioctl (it shows in the process's CPU time, as real NVML system time does)
and the rest sleeping (remainders under 0.2 ms are not slept: see `_cost`). The share is `CPU_FRACTIONS`
where measured on the H100 (thread CPU time / wall time: ~1.0 for every call, i.e. the driver computes rather
than waits, even the 3 ms energy counter; 0.036 for nvmlDeviceGetPcieThroughput, which waits 20 ms inside
the driver for its sampling window), else the constructor's `cpu_fraction`.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

DEFAULT_LATENCY_S = 25e-6  # assumed, for the calls nobody measured
DEFAULT_LATENCIES_S: dict[str, float] = {
    "nvmlInit": 0.3,  # assumed (not measured)
    # bench/results/nvml_probe_h100.json (H100 80GB HBM3, driver 580.159.04): medians
    "nvmlDeviceGetMemoryInfo": 8.0e-6,
    "nvmlDeviceGetPowerUsage": 1.8e-6,
    "nvmlDeviceGetTotalEnergyConsumption": 3011e-6,  # p95 7.3 ms
    "nvmlDeviceGetUtilizationRates": 2.0e-6,
    "nvmlDeviceGetClockInfo": 2.5e-6,
    "nvmlDeviceGetTemperature": 2.4e-6,
    "nvmlDeviceGetCurrentClocksEventReasons": 2.1e-6,
    "nvmlDeviceGetComputeRunningProcesses": 11.9e-6,
    "nvmlDeviceGetPowerManagementLimit": 140e-6,  # the agent does not call it (it reads the enforced limit)
    "nvmlDeviceGetApplicationsClock": 975e-6,
    "nvmlDeviceGetPcieThroughput": 20964e-6,  # the driver's 20 ms sampling window
    "nvmlDeviceGetTotalEccErrors": 2.0e-6,
    "nvmlDeviceGetRemappedRows": 2.0e-6,  # the agent does not call it; nvmlDeviceGetRetiredPages: NotSupported
    # same H100 and driver, timed by the throw-away CPU probe (not in the results file)
    "nvmlDeviceGetEnforcedPowerLimit": 2.1e-6,
    "nvmlDeviceGetGraphicsRunningProcesses": 7.2e-6,
    "nvmlEventSetWait": 3.2e-6,
    "nvmlDeviceGetFieldValues": 4.9e-6,  # one field (POWER_INSTANT); plus FIELD_LATENCIES_S per field asked
    # GPM (bench/results/nvml_probe_h100.json): one sample; the metrics are computed from two samples in the
    # library, unmeasured: the assumed DEFAULT_LATENCY_S
    "nvmlGpmSampleGet": 52.8e-6,  # p95 86.8 us
}
# nvmlDeviceGetFieldValues, H100 / 580.159.04 (CPU probe): the call costs what its most expensive fields cost.
# ENERGY alone 2944 us (the same as nvmlDeviceGetTotalEnergyConsumption), ECC SBE+DBE 7.7 us: extra seconds
# when the field is among those asked, beyond the call's own `nvmlDeviceGetFieldValues` latency. NVLink
# counters: that H100 has no NVLink (NOT_SUPPORTED; asking for 18 links x TX+RX took 66 us), so they add
# nothing here: unmeasured.
FIELD_LATENCIES_S: dict[int, float] = {
    _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: 2939e-6,
    _real.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: 1.5e-6,
    _real.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 1.5e-6,
    # unmeasured, assumed to cost what the volatile ECC counts do: the aggregate ECC counts and the NVLink error
    # totals (that H100 had no NVLink)
    _real.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: 1.5e-6,
    _real.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: 1.5e-6,
    _real.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 1.5e-6,
    _real.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: 1.5e-6,
    _real.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: 1.5e-6,
    _real.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 1.5e-6,
    # unmeasured (the H100 probe predates its use), assumed to cost what an ECC count does on top of the call's
    # own latency (nvmlDeviceGetPowerUsage, the same 1-s mean on an H100, measured 1.8 us in all)
    _real.NVML_FI_DEV_POWER_AVERAGE: 1.5e-6,
}
# GPM metrics of an H100 80GB HBM3 running a bf16 8192x8192 matmul (bench/results/nvml_probe_h100.json): the
# values a GPU with `gpm_supported` reports unless a test scripts others. NVML gives PCIe/NVLink in MiB/s.
H100_MATMUL_GPM: dict[int, float] = {
    _real.NVML_GPM_METRIC_SM_UTIL: 96.47,
    _real.NVML_GPM_METRIC_SM_OCCUPANCY: 14.26,
    _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 93.63,
    _real.NVML_GPM_METRIC_DRAM_BW_UTIL: 24.03,
    _real.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 5516329.96 / 1048576,
    _real.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 16084622.35 / 1048576,
    _real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 0.0,  # that H100 has no NVLink
    _real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 0.0,
}
# Measured CPU time / wall time of a call (H100 / 580.159.04, CPU probe); other calls: `cpu_fraction`.
CPU_FRACTIONS: dict[str, float] = {
    "nvmlInit": 0.0,  # assumed: mostly waiting for the driver
    "nvmlDeviceGetPcieThroughput": 0.036,  # 0.75 ms of CPU in 20.8 ms
    **{name: 1.0 for name in DEFAULT_LATENCIES_S if name not in ("nvmlInit", "nvmlDeviceGetPcieThroughput")},
}
_MIN_SLEEP_S = 200e-6
_clock_read: list[float] = []  # what one time.thread_time() costs on this machine (measured once, lazily)


def _clock_read_s() -> float:
    if not _clock_read:
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            time.thread_time()
        _clock_read.append((time.perf_counter() - t) / n)
    return _clock_read[0]
_CONSTANT_PREFIXES = ("NVML_", "nvmlEventType", "nvmlMemory_", "nvmlFlag")


@dataclass
class FakeGpu:
    """One simulated GPU (or MIG device). Tests mutate the attributes between readings."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 85_520_809_984
    memory_used_bytes: int = 1 << 30
    memory_reserved_bytes: int = 502_267_904
    gpu_util: int = 50
    mem_util: int = 20
    # what nvmlDeviceGetPowerUsage and the NVML_FI_DEV_POWER_AVERAGE field answer (on an H100 both are the driver's
    # 1-s mean)
    power_mw: int = 300_000
    power_instant_mw: int | None = None  # None: same as power_mw
    energy_mj: int = 1_000_000
    temperature_c: int = 55
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    app_sm_clock_mhz: int = 1755
    app_mem_clock_mhz: int = 2619
    throttle_reasons: int = 0
    pcie_tx_kib_per_s: int = 1000
    pcie_rx_kib_per_s: int = 2000
    nvlink_links: int = 18
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    ecc_corrected: int = 0  # aggregate (lifetime) counts
    ecc_uncorrected: int = 0
    ecc_corrected_volatile: int = 0  # since the driver loaded
    ecc_uncorrected_volatile: int = 0
    retired_pages_sbe: int = 0
    retired_pages_dbe: int = 0
    retired_pages_pending: bool = False
    remapped_rows_correctable: int = 0
    remapped_rows_uncorrectable: int = 0
    remapped_rows_pending: bool = False
    remapped_rows_failed: bool = False
    pcie_replay: int = 0
    # (link, NVML_NVLINK_ERROR_DL_* counter) -> count; links beyond nvlink_links answer INVALID_ARGUMENT
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    max_sm_clock_mhz: int = 1980
    slowdown_temperature_c: int = 90
    # GPM (Hopper+): off by default, as on every GPU before Hopper. `gpm_metrics` (NVML metric id -> value) is what
    # nvmlGpmMetricsGet reports for the interval ending at the later sample; a metric absent answers NOT_SUPPORTED.
    gpm_supported: bool = False
    gpm_metrics: dict[int, float] = field(default_factory=lambda: dict(H100_MATMUL_GPM))
    pci_bus_id: str = "00000000:00:00.0"
    power_limit_mw: int = 700_000
    default_power_limit_mw: int = 700_000
    min_power_limit_mw: int = 200_000
    max_power_limit_mw: int = 700_000
    # setting the limit answers NVML_ERROR_NO_PERMISSION (not root), as the real driver does
    power_limit_needs_root: bool = False
    # (pid, used bytes or None)
    compute_processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig_devices: list[FakeGpu] = field(default_factory=list)
    # NVML function names that answer NVML_ERROR_NOT_SUPPORTED on this GPU; "power_instant", "power_average", "energy"
    # and "ecc" name field values, "nvlink_errors:<counter>" one NVLink error counter
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    is_mig: bool = False
    gpu_instance_id: int = 0  # a MIG device's GPU instance (nvmlDeviceGetGpuInstanceId)


class _Handle:
    __slots__ = ("gpu",)

    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu


class _Value:
    __slots__ = ("ullVal",)

    def __init__(self, value: int) -> None:
        self.ullVal = value


class _FieldValue:
    """nvmlFieldValue_t as pynvml returns it (the members the agent reads). Slotted: the double's own Python
    should cost little next to the latencies it simulates, which already include pynvml's (measured from Python)."""

    __slots__ = ("fieldId", "scopeId", "nvmlReturn", "valueType", "value")
    valueType: int

    def __init__(self, field_id: int, scope: int, ret: int, value: int | None) -> None:
        self.fieldId, self.scopeId, self.nvmlReturn = field_id, scope, ret
        self.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        self.value = _Value(value or 0)


_fv = _FieldValue
_c_get, _c_set = ctypes.Structure.__getattribute__, ctypes.Structure.__setattr__  # past pynvml's overrides
_ECC_FIELDS = {_real.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: "ecc_corrected",
               _real.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: "ecc_uncorrected",
               _real.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: "ecc_corrected_volatile",
               _real.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "ecc_uncorrected_volatile"}

_NVLINK_ERROR_TOTALS = {_real.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: _real.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                        _real.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: _real.NVML_NVLINK_ERROR_DL_CRC_DATA,
                        _real.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: _real.NVML_NVLINK_ERROR_DL_REPLAY,
                        _real.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: _real.NVML_NVLINK_ERROR_DL_RECOVERY}


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


class FakeNvml:
    """Stands in for the `pynvml` module: same function names, same constants, same exceptions."""

    NVMLError = _real.NVMLError

    def __init__(self, gpus: list[FakeGpu], *, latencies_s: dict[str, float] | None = None,
                 default_latency_s: float = 0.0, cpu_fraction: float = 0.5,
                 cpu_fractions: dict[str, float] | None = None, field_latencies_s: dict[int, float] | None = None,
                 driver_version: str = "550.54.15",
                 cuda_version: int = 12040, nvml_version: str = "12.550.54.15"):
        self.gpus = gpus
        self.latencies_s = latencies_s or {}
        self.default_latency_s = default_latency_s
        self.cpu_fraction = cpu_fraction
        self.cpu_fractions = cpu_fractions or {}
        self.field_latencies_s = field_latencies_s or {}
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.nvml_version = nvml_version
        self.initialised = 0
        self.calls: dict[str, int] = {}
        self._handles = [_Handle(g) for g in gpus]
        self._events: deque[tuple[int, int]] = deque()  # (gpu position, xid)
        # GPM samples by address: the GPU sampled and its scripted metrics then (None: allocated, not sampled)
        self._gpm_samples: dict[int, tuple[str, dict[int, float]] | None] = {}
        self._gpm_buffers: dict[int, Any] = {}
        self.c_nvmlGpmMetricsGet_t = _real.c_nvmlGpmMetricsGet_t
        self._lock = threading.Lock()
        # constants (NVML_*, nvmlEventType*, nvmlMemory_v2) are the real module's, copied once
        for name in dir(_real):
            if name.startswith(_CONSTANT_PREFIXES) and not callable(getattr(_real, name)):
                setattr(self, name, getattr(_real, name))

    @classmethod
    def with_gpus(cls, n: int, *, realistic: bool = False, **kw: Any) -> FakeNvml:
        """`n` GPUs with one compute process each. `realistic`: the H100 latencies and GPM, and the process is this
        one (a pid that exists, as a job's does on a real node, so that the attribution's /proc lookups take
        their steady-state path: one cached stat read per process and interval), else pid 10000 + i."""
        pids = [os.getpid()] * n if realistic else [10_000 + i for i in range(n)]
        # realistic: the H100's GPM, and its retired-pages call answers NOT_SUPPORTED (it remaps rows instead)
        gpus = [FakeGpu(uuid=f"GPU-fake{i:04d}-0000-0000-0000-000000000000", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                        compute_processes=[(pids[i], 20 << 30)], gpm_supported=realistic,
                        unsupported={"nvmlDeviceGetRetiredPages"} if realistic else set())
                for i in range(n)]
        if realistic:
            kw.setdefault("latencies_s", DEFAULT_LATENCIES_S)
            kw.setdefault("default_latency_s", DEFAULT_LATENCY_S)
            kw.setdefault("cpu_fractions", CPU_FRACTIONS)
            kw.setdefault("field_latencies_s", FIELD_LATENCIES_S)
        return cls(gpus, **kw)

    # ------------------------------------------------------------------------------------------ helpers

    def xid(self, gpu_position: int, xid: int) -> None:
        """Inject an XID event on a physical GPU."""
        self._events.append((gpu_position, xid))

    def _cost(self, name: str, extra_s: float = 0.0) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        latency = self.latencies_s.get(name, self.default_latency_s) + extra_s
        if latency <= 0:
            return
        spin = latency * self.cpu_fractions.get(name, self.cpu_fraction)
        # spin on this thread's CPU clock, not the wall clock: on a busy machine a preempted spin would
        # otherwise charge less CPU than the call costs. Reading that clock is itself a syscall (1.4 us on the
        # bench machine), and the spin stops only at the first read past its end: it overshoots by about one read
        # (the first read's own cost before its sample, the last one's after, and where the last sample falls
        # past the end), so it aims one read short. Measured on the bench machine (thread CPU per call, 1.8 us to
        # 3 ms latencies): the charge was 0.9-1.2 us over the latency (6 us at 3 ms), now 0.4-0.7 us over.
        end = time.thread_time() + spin - _clock_read_s()
        while time.thread_time() < end:
            pass
        # A real call is one ioctl; a nanosleep for a few microseconds would add a second syscall and a
        # context switch the real thing does not pay, so short off-CPU remainders are not simulated.
        if latency - spin >= _MIN_SLEEP_S:
            time.sleep(latency - spin)

    def _check(self, name: str, handle: _Handle, feature: str | None = None, extra_s: float = 0.0) -> FakeGpu:
        self._cost(name, extra_s)
        if not self.initialised:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        gpu = handle.gpu
        if gpu.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        if (feature or name) in gpu.unsupported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # ------------------------------------------------------------------------------------------ system

    def nvmlInit(self) -> None:
        self._cost("nvmlInit")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised = max(0, self.initialised - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_version

    def nvmlSystemGetNVMLVersion(self) -> bytes:
        return self.nvml_version.encode()

    def nvmlDeviceGetCount(self) -> int:
        self._cost("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if index >= len(self._handles):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        for h in self._handles:
            if h.gpu.uuid == uuid and not h.gpu.lost:
                return h
            for m in h.gpu.mig_devices:
                if m.uuid == uuid and not m.lost:
                    return _Handle(m)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    # ------------------------------------------------------------------------------------------ device

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._check("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._check("nvmlDeviceGetName", h).name

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._check("nvmlDeviceGetPciInfo", h).pci_bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> SimpleNamespace:
        g = self._check("nvmlDeviceGetMemoryInfo", h, "nvmlDeviceGetMemoryInfo_v2" if version else None)
        if version:
            return SimpleNamespace(total=g.memory_total_bytes, reserved=g.memory_reserved_bytes,
                                   used=g.memory_used_bytes,
                                   free=g.memory_total_bytes - g.memory_used_bytes - g.memory_reserved_bytes)
        # v1 counts the reserved memory as used
        used = g.memory_used_bytes + g.memory_reserved_bytes
        return SimpleNamespace(total=g.memory_total_bytes, used=used, free=g.memory_total_bytes - used)

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        g = self._check("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.gpu_util, memory=g.mem_util)

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetPowerManagementDefaultLimit", h).default_power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: _Handle) -> list[int]:
        g = self._check("nvmlDeviceGetPowerManagementLimitConstraints", h)
        if g.is_mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return [g.min_power_limit_mw, g.max_power_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, h: _Handle, limit_mw: int) -> None:
        g = self._check("nvmlDeviceSetPowerManagementLimit", h)
        if g.is_mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if g.power_limit_needs_root:
            raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)
        if not g.min_power_limit_mw <= limit_mw <= g.max_power_limit_mw:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        g.power_limit_mw = int(limit_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetTotalEnergyConsumption", h, "energy").energy_mj

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: list[Any]) -> list[_FieldValue]:
        costs = self.field_latencies_s
        # once per field kind asked (the per-link NVLink fields, (id, link) pairs, have no measured cost)
        extra = sum(costs.get(f, 0.0) for f in set(field_ids) if not isinstance(f, tuple)) if costs else 0.0
        g = self._check("nvmlDeviceGetFieldValues", h, extra_s=extra)
        ok, unsupported = _real.NVML_SUCCESS, _real.NVML_ERROR_NOT_SUPPORTED
        out = []
        tx_id, rx_id = _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        per_link = max(1, g.nvlink_links)
        for f in field_ids:
            fid, scope = f if isinstance(f, tuple) else (f, 0)
            if fid == tx_id:  # the most numerous (one per link): first
                out.append(_fv(fid, scope, ok, g.nvlink_tx_kib // per_link))
            elif fid == rx_id:
                out.append(_fv(fid, scope, ok, g.nvlink_rx_kib // per_link))
            elif fid == _real.NVML_FI_DEV_POWER_INSTANT:
                bad = "power_instant" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok,
                               g.power_mw if g.power_instant_mw is None else g.power_instant_mw))
            elif fid == _real.NVML_FI_DEV_POWER_AVERAGE:
                bad = "power_average" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok, g.power_mw))
            elif fid == _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                bad = "energy" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok, g.energy_mj))
            elif fid in _ECC_FIELDS:
                bad = "ecc" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok, getattr(g, _ECC_FIELDS[fid])))
            elif fid in _NVLINK_ERROR_TOTALS:  # the driver's sum over the links of one error counter
                counter = _NVLINK_ERROR_TOTALS[fid]
                bad = f"nvlink_errors:{counter}" in g.unsupported or g.is_mig or g.nvlink_links == 0
                out.append(_fv(fid, scope, unsupported if bad else ok,
                               sum(n for (link, c), n in g.nvlink_errors.items() if c == counter
                                   and link < g.nvlink_links)))
            elif fid == _real.NVML_FI_DEV_NVLINK_LINK_COUNT:
                out.append(_fv(fid, scope, unsupported if g.nvlink_links == 0 else ok, g.nvlink_links))
            else:
                out.append(_fv(fid, scope, unsupported, None))
        return out

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return self._check("nvmlDeviceGetTemperature", h).temperature_c

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        g = self._check("nvmlDeviceGetClockInfo", h)
        return g.sm_clock_mhz if clock == _real.NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetApplicationsClock(self, h: _Handle, clock: int) -> int:
        g = self._check("nvmlDeviceGetApplicationsClock", h)
        return g.app_sm_clock_mhz if clock == _real.NVML_CLOCK_SM else g.app_mem_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksEventReasons", h).throttle_reasons

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        g = self._check("nvmlDeviceGetPcieThroughput", h)
        return g.pcie_tx_kib_per_s if counter == _real.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kib_per_s

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        g = self._check("nvmlDeviceGetTotalEccErrors", h, "ecc")
        corrected = error_type == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == _real.NVML_VOLATILE_ECC:
            return g.ecc_corrected_volatile if corrected else g.ecc_uncorrected_volatile
        return g.ecc_corrected if corrected else g.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> list[int]:
        g = self._check("nvmlDeviceGetRetiredPages", h)
        n = g.retired_pages_sbe if cause == _real.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS \
            else g.retired_pages_dbe
        return [0x1000 * (i + 1) for i in range(n)]  # page addresses

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Handle) -> int:
        g = self._check("nvmlDeviceGetRetiredPagesPendingStatus", h, "nvmlDeviceGetRetiredPages")
        return _real.NVML_FEATURE_ENABLED if g.retired_pages_pending else _real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        g = self._check("nvmlDeviceGetRemappedRows", h)
        return (g.remapped_rows_correctable, g.remapped_rows_uncorrectable, int(g.remapped_rows_pending),
                int(g.remapped_rows_failed))

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return self._check("nvmlDeviceGetPcieReplayCounter", h).pcie_replay

    def nvmlDeviceGetNvLinkErrorCounter(self, h: _Handle, link: int, counter: int) -> int:
        g = self._check("nvmlDeviceGetNvLinkErrorCounter", h, f"nvlink_errors:{counter}")
        if g.is_mig or not 0 <= link < g.nvlink_links:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetMaxClockInfo(self, h: _Handle, clock: int) -> int:
        g = self._check("nvmlDeviceGetMaxClockInfo", h)
        return g.max_sm_clock_mhz if clock == _real.NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetTemperatureThreshold(self, h: _Handle, threshold: int) -> int:
        g = self._check("nvmlDeviceGetTemperatureThreshold", h)
        if threshold != _real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return g.slowdown_temperature_c

    # ------------------------------------------------------------------------------------------ GPM

    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> SimpleNamespace:
        g = self._check("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=_real.NVML_GPM_SUPPORT_VERSION,
                               isSupportedDevice=int(g.gpm_supported and not g.is_mig))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._cost("nvmlGpmSampleAlloc")
        buf = ctypes.create_string_buffer(8)  # an address of its own, as the library's opaque sample has
        sample = ctypes.cast(buf, _real.c_nvmlGpmSample_t)
        self._gpm_buffers[_address(sample)] = buf
        self._gpm_samples[_address(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._gpm_samples.pop(_address(sample), None)
        self._gpm_buffers.pop(_address(sample), None)

    def nvmlGpmSampleGet(self, h: _Handle, sample: Any) -> Any:
        g = self._check("nvmlGpmSampleGet", h)
        if not g.gpm_supported or g.is_mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        key = _address(sample)
        if key not in self._gpm_samples:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)  # never allocated, or freed
        self._gpm_samples[key] = (g.uuid, dict(g.gpm_metrics))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """As the library: both samples taken, of the same GPU, and distinct; each metric's own return code.
        The request's fields are read and written as the library does, on the ctypes structure itself: past
        pynvml's Python __getattribute__ (~1 us a field), a cost the C library filling the request does not pay."""
        self._cost("nvmlGpmMetricsGet")
        get, put = _c_get, _c_set
        s1, s2 = _address(get(request, "sample1")), _address(get(request, "sample2"))
        first, second = self._gpm_samples.get(s1), self._gpm_samples.get(s2)
        if first is None or second is None or first[0] != second[0] or s1 == s2:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        if get(request, "version") != _real.NVML_GPM_METRICS_GET_VERSION:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        values = second[1]
        ok, unsupported = _real.NVML_SUCCESS, _real.NVML_ERROR_NOT_SUPPORTED
        metrics = get(request, "metrics")
        for i in range(get(request, "numMetrics")):
            m = metrics[i]
            v = values.get(get(m, "metricId"))
            put(m, "nvmlReturn", ok if v is not None else unsupported)
            put(m, "value", 0.0 if v is None else v)
        return request

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[SimpleNamespace]:
        g = self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.compute_processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: _Handle) -> list[SimpleNamespace]:
        g = self._check("nvmlDeviceGetGraphicsRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.graphics_processes]

    # ------------------------------------------------------------------------------------------ MIG

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        g = self._check("nvmlDeviceGetMigMode", h)
        if g.is_mig or "mig" in g.unsupported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        mode = _real.NVML_DEVICE_MIG_ENABLE if g.mig_devices else _real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        g = self._check("nvmlDeviceGetGpuInstanceId", h)
        if not g.is_mig:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)  # as NVML, for a whole GPU's handle
        return g.gpu_instance_id

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:
        g = self._check("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= len(g.mig_devices):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return _Handle(g.mig_devices[index])

    # ------------------------------------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: _Handle, event_types: int, event_set: object) -> None:
        self._check("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._cost("nvmlEventSetWait")
        if not self._events:
            raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)
        position, xid = self._events.popleft()
        return SimpleNamespace(device=self._handles[position], eventType=_real.nvmlEventTypeXidCriticalError,
                               eventData=xid, gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass
