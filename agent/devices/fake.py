"""A test double for the whole `pynvml` module (Zeus style), with realistic per-call latencies.

`NvmlDevices(FakeNvml(...))` runs the real NVML code path on a machine without a GPU: the unit tests use it
with zero latency, the overhead benchmark with `DEFAULT_LATENCIES_S`. Error classes and constants are the
real `pynvml` ones (pure Python; importing pynvml loads no library until nvmlInit), so the error mapping is
tested against what the driver raises.

Latency model: each call takes its latency, of which `cpu_fraction` is spent spinning to stand for the
kernel time of the ioctl (it shows in the process's CPU time, as real NVML system time does) and the rest
sleeping (remainders under 0.2 ms are not slept: see `_cost`).
`nvmlDeviceGetPcieThroughput` samples for 20 ms inside the driver (documented NVML behaviour): all sleep.
The sub-millisecond figures are assumptions in the range reported for datacenter GPUs with a persistence
daemon; measure and replace them on a real GPU (`bench/agent_overhead.py --source nvml`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

DEFAULT_LATENCY_S = 25e-6
DEFAULT_LATENCIES_S: dict[str, float] = {
    "nvmlInit": 0.3,
    "nvmlDeviceGetComputeRunningProcesses": 150e-6,
    "nvmlDeviceGetGraphicsRunningProcesses": 100e-6,
    "nvmlDeviceGetFieldValues": 40e-6,
    "nvmlDeviceGetPcieThroughput": 20e-3,
    "nvmlDeviceGetMemoryInfo": 15e-6,
    "nvmlDeviceGetUtilizationRates": 20e-6,
    "nvmlDeviceGetPowerUsage": 30e-6,
    "nvmlDeviceGetTemperature": 10e-6,
    "nvmlEventSetWait": 10e-6,
}
_MIN_SLEEP_S = 200e-6
_CONSTANT_PREFIXES = ("NVML_", "nvmlEventType", "nvmlMemory_", "nvmlFlag")
_SLEEP_ONLY = frozenset({"nvmlDeviceGetPcieThroughput", "nvmlInit"})


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
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
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
    # NVML function names that answer NVML_ERROR_NOT_SUPPORTED on this GPU; "power_instant", "energy"
    # and "ecc" name field values
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    is_mig: bool = False


class _Handle:
    __slots__ = ("gpu",)

    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu


def _fv(field_id: int, scope: int, ret: int, value: int | None) -> SimpleNamespace:
    return SimpleNamespace(fieldId=field_id, scopeId=scope, nvmlReturn=ret,
                           valueType=_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                           value=SimpleNamespace(ullVal=value or 0))


class FakeNvml:
    """Stands in for the `pynvml` module: same function names, same constants, same exceptions."""

    NVMLError = _real.NVMLError

    def __init__(self, gpus: list[FakeGpu], *, latencies_s: dict[str, float] | None = None,
                 default_latency_s: float = 0.0, cpu_fraction: float = 0.5, driver_version: str = "550.54.15",
                 cuda_version: int = 12040, nvml_version: str = "12.550.54.15"):
        self.gpus = gpus
        self.latencies_s = latencies_s or {}
        self.default_latency_s = default_latency_s
        self.cpu_fraction = cpu_fraction
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.nvml_version = nvml_version
        self.initialised = 0
        self.calls: dict[str, int] = {}
        self._handles = [_Handle(g) for g in gpus]
        self._events: deque[tuple[int, int]] = deque()  # (gpu position, xid)
        self._lock = threading.Lock()
        # constants (NVML_*, nvmlEventType*, nvmlMemory_v2) are the real module's, copied once
        for name in dir(_real):
            if name.startswith(_CONSTANT_PREFIXES) and not callable(getattr(_real, name)):
                setattr(self, name, getattr(_real, name))

    @classmethod
    def with_gpus(cls, n: int, *, realistic: bool = False, **kw: Any) -> FakeNvml:
        gpus = [FakeGpu(uuid=f"GPU-fake{i:04d}-0000-0000-0000-000000000000", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                        compute_processes=[(10_000 + i, 20 << 30)]) for i in range(n)]
        if realistic:
            kw.setdefault("latencies_s", DEFAULT_LATENCIES_S)
            kw.setdefault("default_latency_s", DEFAULT_LATENCY_S)
        return cls(gpus, **kw)

    # ------------------------------------------------------------------------------------------ helpers

    def xid(self, gpu_position: int, xid: int) -> None:
        """Inject an XID event on a physical GPU."""
        self._events.append((gpu_position, xid))

    def _cost(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        latency = self.latencies_s.get(name, self.default_latency_s)
        if latency <= 0:
            return
        spin = 0.0 if name in _SLEEP_ONLY else latency * self.cpu_fraction
        end = time.perf_counter() + spin
        while time.perf_counter() < end:
            pass
        # A real call is one ioctl; a nanosleep for a few microseconds would add a second syscall and a
        # context switch the real thing does not pay, so short off-CPU remainders are not simulated.
        if latency - spin >= _MIN_SLEEP_S:
            time.sleep(latency - spin)

    def _check(self, name: str, handle: _Handle, feature: str | None = None) -> FakeGpu:
        self._cost(name)
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

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: list[Any]) -> list[SimpleNamespace]:
        g = self._check("nvmlDeviceGetFieldValues", h)
        ok, unsupported = _real.NVML_SUCCESS, _real.NVML_ERROR_NOT_SUPPORTED
        out = []
        for f in field_ids:
            fid, scope = f if isinstance(f, tuple) else (f, 0)
            if fid == _real.NVML_FI_DEV_POWER_INSTANT:
                bad = "power_instant" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok,
                               g.power_mw if g.power_instant_mw is None else g.power_instant_mw))
            elif fid == _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                bad = "energy" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok, g.energy_mj))
            elif fid in (_real.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, _real.NVML_FI_DEV_ECC_DBE_VOL_TOTAL):
                bad = "ecc" in g.unsupported or g.is_mig
                out.append(_fv(fid, scope, unsupported if bad else ok,
                               g.ecc_corrected if fid == _real.NVML_FI_DEV_ECC_SBE_VOL_TOTAL else g.ecc_uncorrected))
            elif fid == _real.NVML_FI_DEV_NVLINK_LINK_COUNT:
                out.append(_fv(fid, scope, unsupported if g.nvlink_links == 0 else ok, g.nvlink_links))
            elif fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                out.append(_fv(fid, scope, ok, g.nvlink_tx_kib // max(1, g.nvlink_links)))
            elif fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                out.append(_fv(fid, scope, ok, g.nvlink_rx_kib // max(1, g.nvlink_links)))
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
        g = self._check("nvmlDeviceGetTotalEccErrors", h)
        return g.ecc_corrected if error_type == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_uncorrected

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
