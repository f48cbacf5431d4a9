"""NVML implementation of the device interface (nvidia-ml-py's `pynvml`, imported lazily).

Degrade, don't fail (Datadog's NVML check): a field the GPU does not support is None, logged once per GPU,
and not asked again; a GPU that is lost (or whose driver fails) raises `GpuLostError` for that slot only,
and the next reading tries to get its handle back by UUID. Every `pynvml.NVMLError` is mapped to the
exceptions of `agent.devices.base` in `map_nvml_error`; nothing above this module sees a pynvml type.

The `nvml` constructor argument takes the whole module, so tests and the benchmark pass the test double of
`agent.devices.fake` (Zeus style: no GPU needed).

Cadences (what each call costs on an H100, driver 580.159.04: bench/results/nvml_probe_h100.json and
agent/devices/fake.py; nearly all of it is CPU time of the driver, not waiting):
- `read_fast` (10 Hz, the peak loop): memory used (8 us), nothing else, and power where it is an instantaneous
  reading. Where the GPU answers NVML_FI_DEV_POWER_AVERAGE (the driver's own 1-s mean, preferred), power is read
  with the interval's reading and, for intervals over a second, by the first fast reading a second or more after
  the last read: ten instantaneous reads a second would only re-sample the windows that mean is made of (on
  A100/H100 the sensor measures 25 ms of every 100 ms: Yang et al., "Accurate and Convenient Energy Measurements
  for GPUs", SC'24), at ~0.1 % of a core on an 8-GPU node. `power_instant_10hz` keeps the 10 Hz instantaneous
  reads (power_max_w then holds 10 Hz peaks instead of the highest 1-s mean);
- `read` (every shipping interval): utilization, temperature, SM/memory clocks, clock event reasons, the
  enforced power limit (2 us), ECC totals, NVLink counters and processes: each a few microseconds;
- every `slow_every` readings of a GPU (default 60: at 30 the energy reads alone cost an 8-GPU node 0.08 % of a
  core), staggered across GPUs so that a pass reads at most one GPU's slow fields (with up to 60 GPUs), and at the
  first reading (and the first after a lost GPU is back): the energy counter (~3 ms of driver CPU per GPU, even
  through nvmlDeviceGetFieldValues) and PCIe throughput (20 ms of driver sampling per direction, 0.75 ms of it
  CPU). In between both are null ("not read this interval"): a counter or rate repeated from an earlier reading
  would be wrong for the row's timestamp;
- every `static_every` readings (default 300): the application clocks (~1 ms each, they change only when an
  administrator sets them); the value last read is sent on every row;
- GPM (Hopper and later, `nvmlGpmQueryDeviceSupport`): one `nvmlGpmSampleGet` per reading (53 us on the H100)
  into one of two buffers allocated at start-up, and `nvmlGpmMetricsGet` between it and the previous reading's
  sample: the metrics cover exactly the interval between two readings, and nothing sleeps. The first reading
  (and the first after a lost GPU is back, or after a failed sample) has no GPM values. On such a GPU the PCIe
  and NVLink rates (pcie_*, nvlink_*) are GPM's too, every reading: nvmlDeviceGetPcieThroughput (a 20 ms window
  every 60 readings) and the 2 x links NVLink data counters (36 fields on an H100, every reading) are not read;
- every `health_every` readings (default 30, staggered like the slow fields, and at the first reading): the
  health counters, which change rarely: volatile ECC counts, retired pages and their pending flag, remapped rows,
  the PCIe replay counter and the NVLink error counters (the driver's totals over the links); null in between.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent.devices.base import (
    DeviceError,
    DevicePermissionError,
    Devices,
    DeviceUnavailableError,
    FieldNotSupportedError,
    GpuIdentity,
    GpuLostError,
    GpuProcess,
    GpuReading,
    NodeFacts,
)
from fleetprof.protocol import SampleSource

log = logging.getLogger(__name__)
T = TypeVar("T")

# NVML error names -> our exception types. Anything not listed is a transient DeviceError.
_LOST = ("GPU_IS_LOST", "RESET_REQUIRED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "IRQ_ISSUE",
         "GPU_NOT_FOUND", "UNINITIALIZED", "UNKNOWN")
_UNSUPPORTED = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "DEPRECATED",
                "INVALID_ARGUMENT", "NOT_FOUND")
_UNAVAILABLE = ("LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED", "NO_PERMISSION", "LIB_RM_VERSION_MISMATCH")
_POWER_INSTANT = "field:NVML_FI_DEV_POWER_INSTANT"
_POWER_FIELD_AVERAGE = "field:NVML_FI_DEV_POWER_AVERAGE"  # the driver's 1-s mean, read once a second
_POWER_AVERAGE = "nvmlDeviceGetPowerUsage"  # a 1-s average on Ampere+ (not GA100), instantaneous on older GPUs
POWER_AVERAGE_WINDOW_S = 1.0  # NVML_FI_DEV_POWER_AVERAGE's window: read it no more often than this
# power_source -> the name its reading is logged, and remembered as unsupported, under
_POWER_FIELDS = {_POWER_INSTANT: "power_instant", _POWER_FIELD_AVERAGE: "power_average", _POWER_AVERAGE: "power"}
SLOW_EVERY = 60  # energy counter, PCIe throughput (GPUs without GPM): readings of a GPU between two reads
STATIC_EVERY = 300  # application clocks
HEALTH_EVERY = 30  # health counters (ECC volatile, retired pages, remapped rows, PCIe replay, NVLink errors)
_SLOW_FIELDS = frozenset({"energy"})  # the _SCALAR_FIELDS read only when the slow fields are due
_HEALTH_FIELDS = frozenset({"ecc_corrected_volatile", "ecc_uncorrected_volatile", "nvlink_crc_flit_errors",
                            "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors"})  # health due
_NVLINK_ERRORS = "nvlink_errors_total"  # the GpuReading attribute the NVLink error fields add up into
# scalar fields read with nvmlDeviceGetFieldValues: (name for logs, NVML constant, GpuReading attribute)
_SCALAR_FIELDS = (
    ("energy", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj"),  # mJ since driver load, Volta+
    # aggregate (lifetime) ECC counts every interval, as ever; the volatile ones with the health counters
    ("ecc_corrected", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_corrected_total"),
    ("ecc_uncorrected", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_uncorrected_total"),
    ("ecc_corrected_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected_volatile"),
    ("ecc_uncorrected_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected_volatile"),
    ("power_instant", "NVML_FI_DEV_POWER_INSTANT", "power_mw"),
    ("power_average", "NVML_FI_DEV_POWER_AVERAGE", "power_mw"),
    # NVLink data-link errors, each summed over the links by the driver (what nvmlDeviceGetNvLinkErrorCounter
    # counts per link: 4 fields in this one call instead of 4 calls per link, 72 on an 18-link H100); added up
    # into nvlink_errors_total with the health counters
    ("nvlink_crc_flit_errors", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", _NVLINK_ERRORS),
    ("nvlink_crc_data_errors", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", _NVLINK_ERRORS),
    ("nvlink_replay_errors", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", _NVLINK_ERRORS),
    ("nvlink_recovery_errors", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", _NVLINK_ERRORS),
)
# GPM metrics read each interval: (NVML metric constant, GpuReading attribute, factor to the attribute's unit).
# NVML gives PCIe and NVLink traffic in MiB/s.
_MIB = 1024.0 * 1024.0
_GPM_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", "gpm_sm_activity_pct", 1.0),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "gpm_sm_occupancy_pct", 1.0),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "gpm_tensor_activity_pct", 1.0),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "gpm_dram_bw_util_pct", 1.0),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "gpm_pcie_tx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "gpm_pcie_rx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "gpm_nvlink_tx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "gpm_nvlink_rx_bytes_per_s", _MIB),
)


_c_field = ctypes.Structure.__getattribute__  # a ctypes structure's field, without a subclass's override


def _codes(nvml: Any, names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(getattr(nvml, "NVML_ERROR_" + n) for n in names if hasattr(nvml, "NVML_ERROR_" + n))


def map_nvml_error(nvml: Any, exc: Exception, slot: int = -1) -> DeviceError:
    """Our exception for a pynvml.NVMLError (by its numeric code, which both pynvml and the double carry)."""
    code = getattr(exc, "value", None)
    if code in _codes(nvml, _LOST):
        return GpuLostError(slot, f"{exc} (NVML error {code})")
    if code in _codes(nvml, _UNSUPPORTED):
        return FieldNotSupportedError(f"{exc} (NVML error {code})")
    if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", None):
        return DevicePermissionError(f"{exc} (NVML error {code})")
    return DeviceError(f"{exc} (NVML error {code})")


_KIB = 1024.0


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def mig_profile(name: str) -> str | None:
    """A MIG device's profile from its NVML name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() or None if sep else None


def _handle_key(handle: object) -> int:
    """A hashable identity for an NVML handle (ctypes pointers compare by address, the double by id)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    return id(handle)


_VALUE_ATTRS = (("NVML_VALUE_TYPE_DOUBLE", "dVal"), ("NVML_VALUE_TYPE_UNSIGNED_INT", "uiVal"),
                ("NVML_VALUE_TYPE_UNSIGNED_LONG", "ulVal"), ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "ullVal"),
                ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "sllVal"), ("NVML_VALUE_TYPE_SIGNED_INT", "siVal"),
                ("NVML_VALUE_TYPE_UNSIGNED_SHORT", "usVal"))


def value_reader(nvml: Any) -> Callable[[Any], float | int | None]:
    """A function reading an nvmlFieldValue_t's value by its valueType (the union member to use)."""
    attrs = {getattr(nvml, name): attr for name, attr in _VALUE_ATTRS if hasattr(nvml, name)}

    def read(fv: Any) -> float | int | None:
        attr = attrs.get(fv.valueType)
        return None if attr is None else getattr(fv.value, attr)

    return read


class _Gpm:
    """One GPU's GPM state: two sample buffers (the previous reading's and this one's, swapped after each reading)
    and the metrics request, built once (its metric ids set) and filled by every nvmlGpmMetricsGet."""

    __slots__ = ("prev", "cur", "request", "attrs", "metrics", "have_prev")

    def __init__(self, prev: Any, cur: Any, request: Any, attrs: list[tuple[str, float]]):
        self.prev, self.cur, self.request, self.attrs = prev, cur, request, attrs
        # the request's metric entries, looked up once: views into its buffer, which every nvmlGpmMetricsGet fills
        # (pynvml's structures override __getattribute__ in Python: reading them through it costs ~1 us a field)
        metrics = request.metrics
        self.metrics = [(metrics[i], attr, factor) for i, (attr, factor) in enumerate(attrs)]
        self.have_prev = False


class NvmlDevices(Devices):
    """All GPUs (and MIG devices) NVML sees on this node. Not thread-safe: one sampler owns it."""

    source: SampleSource = "nvml"

    def __init__(self, nvml: Any = None, *, xid_events: bool = True,
                 clock: Callable[[], float] = time.monotonic, slow_every: int = SLOW_EVERY,
                 static_every: int = STATIC_EVERY, health_every: int = HEALTH_EVERY, gpm: bool = True,
                 power_instant_10hz: bool = False):
        # `nvml`: the pynvml module or a test double of it (untyped: pynvml ships no type hints).
        # `power_instant_10hz`: read instantaneous power at every fast reading even where the driver's 1-s mean is
        # available (AgentSettings.power_instant_10hz)
        if nvml is None:
            try:
                import pynvml  # lazy: nodes without the agent extra can still import agent/
            except ImportError as exc:
                raise DeviceUnavailableError("nvidia-ml-py is not installed (pip install 'fleetprof[agent]')") from exc
            nvml = pynvml
        self._nvml = nvml
        self._clock = clock
        self._slow_every = max(1, slow_every)
        self._static_every = max(1, static_every)
        self._health_every = max(1, health_every)
        self._gpm_wanted = gpm
        self._power_average_wanted = not power_instant_10hz
        self._nvlink_prev: dict[int, tuple[float, int, int]] = {}
        self._lost_codes = _codes(nvml, _LOST)
        self._field_value = value_reader(nvml)
        self._success = nvml.NVML_SUCCESS
        self._skip: set[tuple[int, str]] = set()  # (slot, field) found unsupported: not asked again
        self._warned: set[tuple[int, str]] = set()
        self._closed = False
        self._lock = threading.Lock()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise DeviceUnavailableError(f"NVML cannot be initialised: {exc}") from exc
        try:
            self._facts = self._read_facts()
            self._handles: list[Any] = []
            self._ids: list[GpuIdentity] = []
            self._v2_memory: list[bool] = []
            self._nvlink_fields: list[list[tuple[int, int]]] = []
            self._lost: list[bool] = []
            self._reads: list[int] = []  # full readings since start (or since the GPU came back)
            self._app_clocks: list[tuple[float | None, float | None]] = []  # last read (SM, memory) MHz
            self._power_instant_ids: list[Any] = [getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", None)]
            self._power_average_ids: list[Any] = [getattr(nvml, "NVML_FI_DEV_POWER_AVERAGE", None)]
            # per slot, the clock when the driver's 1-s power mean was last read (power_source _POWER_FIELD_AVERAGE)
            self._power_read_at: list[float] = []
            # per slot, the 10 Hz reading as one closure over its handle and calls (see read_fast)
            self._fast_plan: list[Callable[[], tuple[int | None, int | None]] | None] = []
            self._gpm: list[_Gpm | None] = []  # None: no GPM on this GPU (or MIG device)
            self._nvlink_links: list[int] = []  # NVLink link count (0: none)
            self._discover()
            self._event_set: Any = None
            self._event_slots: dict[int, int] = {}
            if xid_events:
                self._register_xid_events()
        except nvml.NVMLError as exc:
            self.close()
            raise DeviceUnavailableError(f"NVML device discovery failed: {exc}") from exc

    # ------------------------------------------------------------------------------------------ setup

    def _read_facts(self) -> NodeFacts:
        nvml = self._nvml

        def opt(fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except nvml.NVMLError:
                return None

        cuda = opt(nvml.nvmlSystemGetCudaDriverVersion)
        nvml_version = opt(nvml.nvmlSystemGetNVMLVersion)
        driver = opt(nvml.nvmlSystemGetDriverVersion)
        return NodeFacts(
            driver_version=_text(driver) if driver is not None else None,
            # 12040 -> "12.4"
            cuda_version=f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None,
            nvml_version=_text(nvml_version) if nvml_version is not None else None,
        )

    def _discover(self) -> None:
        nvml = self._nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            parent = self._add(handle, index, mig_parent_uuid=None)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            except nvml.NVMLError:
                continue  # MIG not supported on this GPU
            if current != nvml.NVML_DEVICE_MIG_ENABLE:
                continue
            try:
                count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
            except nvml.NVMLError as exc:
                log.warning("GPU %s: MIG enabled but its devices cannot be listed: %s", parent.uuid, exc)
                continue
            for mig_index in range(count):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
                except nvml.NVMLError:
                    continue  # empty MIG slot (NVML_ERROR_NOT_FOUND)
                self._add(mig, index, mig_parent_uuid=parent.uuid)

    def _add(self, handle: Any, index: int, *, mig_parent_uuid: str | None) -> GpuIdentity:
        nvml = self._nvml
        slot = len(self._handles)
        self._handles.append(handle)
        self._lost.append(False)
        self._reads.append(0)
        self._app_clocks.append((None, None))
        self._fast_plan.append(None)
        self._power_read_at.append(float("-inf"))
        self._v2_memory.append(hasattr(nvml, "nvmlMemory_v2"))
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        # provisional identity so that log lines of the probes below can name the GPU
        self._ids.append(GpuIdentity(slot=slot, index=index, uuid=uuid, name="?",
                                     mig_parent_uuid=mig_parent_uuid))
        self._nvlink_fields.append([])
        self._gpm.append(None)
        self._nvlink_links.append(0)
        try:
            self._ids[slot] = self._identify(slot, handle, index, uuid, mig_parent_uuid)
        except GpuLostError as exc:
            # keep the slot: it is reported unhealthy, and revived if it comes back
            log.warning("GPU %s is lost at start-up: %s", uuid, exc)
        return self._ids[slot]

    def _identify(self, slot: int, handle: Any, index: int, uuid: str, mig_parent_uuid: str | None) -> GpuIdentity:
        nvml = self._nvml
        physical = mig_parent_uuid is None
        name = _text(self._get(slot, "name", nvml.nvmlDeviceGetName, handle) or "unknown")
        pci = self._get(slot, "pci_info", nvml.nvmlDeviceGetPciInfo, handle) if physical else None
        mem = self._memory_info(slot)
        # MIG devices have no power sensor, energy counter or NVLink of their own: the parent reports them
        power_source = self._probe_power(slot) if physical else None
        limit = self._get(slot, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle) if physical else None
        default_limit = (self._get(slot, "power_default_limit", nvml.nvmlDeviceGetPowerManagementDefaultLimit,
                                   handle) if physical else None)
        self._nvlink_fields[slot] = self._probe_nvlink(slot) if physical else []
        max_sm = self._get(slot, "max_sm_clock", nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM) \
            if physical else None
        slowdown = self._get(slot, "slowdown_temperature", nvml.nvmlDeviceGetTemperatureThreshold, handle,
                             nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) if physical else None
        # GPM of a MIG device needs its GPU instance (nvmlGpmMigSampleGet): not sampled, the parent's is
        self._gpm[slot] = self._probe_gpm(slot) if physical and self._gpm_wanted else None
        instance = None if physical else self._get(slot, "gpu_instance_id", nvml.nvmlDeviceGetGpuInstanceId, handle)
        return GpuIdentity(
            slot=slot, index=index, uuid=uuid, name=name,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            mig_parent_uuid=mig_parent_uuid, power_source=power_source,
            mig_gpu_instance_id=int(instance) if instance is not None else None,
            mig_profile=mig_profile(name) if not physical else None,
            power_limit_mw=limit, default_power_limit_mw=default_limit,
            max_sm_clock_mhz=float(max_sm) if max_sm else None,  # 0 would mean "not reported"
            slowdown_temperature_c=float(slowdown) if slowdown else None,
        )

    def _probe_gpm(self, slot: int) -> _Gpm | None:
        """GPM state for a GPU that supports it (Hopper+), else None (logged once)."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            self._note_unsupported(slot, "gpm", "this nvidia-ml-py has no GPM API")
            return None
        support = self._get(slot, "gpm", nvml.nvmlGpmQueryDeviceSupport, self._handles[slot])
        if support is None:
            return None
        if not support.isSupportedDevice:
            self._note_unsupported(slot, "gpm", "nvmlGpmQueryDeviceSupport: not a GPM device")
            return None
        metrics = [(getattr(nvml, const), attr, factor) for const, attr, factor in _GPM_METRICS
                   if hasattr(nvml, const)]
        try:
            prev, cur = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError as exc:
            self._note_unsupported(slot, "gpm", f"nvmlGpmSampleAlloc: {exc}")
            return None
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        for i, (metric_id, _, _) in enumerate(metrics):
            request.metrics[i].metricId = metric_id
        return _Gpm(prev, cur, request, [(attr, factor) for _, attr, factor in metrics])

    def _probe_power(self, slot: int) -> str | None:
        """Which power reading feeds power_w: the driver's 1-s mean (read once a second) where the GPU has it,
        else the instantaneous field (read at 10 Hz; also with `power_instant_10hz`), else GetPowerUsage (a 1-s
        mean on Ampere+ but GA100, instantaneous before; read at 10 Hz as it cannot say which it is)."""
        nvml = self._nvml
        fields = [(_POWER_INSTANT, "NVML_FI_DEV_POWER_INSTANT")]
        if self._power_average_wanted:
            fields.insert(0, (_POWER_FIELD_AVERAGE, "NVML_FI_DEV_POWER_AVERAGE"))
        for source, name in fields:
            field = getattr(nvml, name, None)
            if field is None:
                continue
            try:
                (fv,) = nvml.nvmlDeviceGetFieldValues(self._handles[slot], [field])
                if fv.nvmlReturn == nvml.NVML_SUCCESS:
                    return source
            except nvml.NVMLError:
                pass
        if self._get(slot, "power", nvml.nvmlDeviceGetPowerUsage, self._handles[slot]) is not None:
            return _POWER_AVERAGE
        return None

    def _probe_nvlink(self, slot: int) -> list[tuple[int, int]]:
        nvml = self._nvml
        if not hasattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"):
            return []
        try:
            (fv,) = nvml.nvmlDeviceGetFieldValues(self._handles[slot], [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        except nvml.NVMLError:
            return []
        links = self._field_value(fv) if fv.nvmlReturn == nvml.NVML_SUCCESS else None
        if not links:
            self._note_unsupported(slot, "nvlink", "no NVLink links")
            return []
        self._nvlink_links[slot] = int(links)
        # per-link cumulative data counters (KiB); scopeId = link number
        return [(f, link) for link in range(int(links))
                for f in (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("NVML event sets unavailable, XID errors will be null: %s", exc)
            return
        for ident, handle in zip(self._ids, self._handles, strict=True):
            if ident.mig_parent_uuid is not None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
                self._event_slots[_handle_key(handle)] = ident.slot
            except nvml.NVMLError as exc:
                self._note_unsupported(ident.slot, "xid_events", str(exc))

    # ------------------------------------------------------------------------------------------ calls

    def _note_unsupported(self, slot: int, field: str, why: str) -> None:
        if (slot, field) not in self._skip:
            self._skip.add((slot, field))
            log.info("GPU %s: %s not supported (%s); reported as null", self._ids[slot].uuid, field, why)

    def _get(self, slot: int, field: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call NVML for one field: None when unsupported (logged once), GpuLostError when the GPU is gone."""
        if (slot, field) in self._skip:
            return None
        try:
            return self._call(slot, fn, *args)
        except (FieldNotSupportedError, DevicePermissionError) as err:
            self._note_unsupported(slot, field, str(err))
        except GpuLostError:
            raise
        except DeviceError as err:  # transient (timeout...): null this time
            if (slot, field) not in self._warned:
                self._warned.add((slot, field))
                log.warning("GPU %s: reading %s failed: %s", self._ids[slot].uuid, field, err)
        return None

    def _memory_info(self, slot: int) -> Any:
        nvml = self._nvml
        handle = self._handles[slot]
        if self._v2_memory[slot]:
            info = self._get(slot, "memory_v2", nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2)
            if info is not None:
                return info
            self._v2_memory[slot] = False  # old driver: v1 has no `reserved`
        return self._get(slot, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)

    def _revive(self, slot: int) -> None:
        """A lost GPU's handle is stale; after a reset it may come back under the same UUID."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(self._ids[slot].uuid)
        except nvml.NVMLError as exc:
            raise GpuLostError(slot, f"still lost: {exc}") from None
        self._handles[slot] = handle
        self._lost[slot] = False
        self._reads[slot] = 0  # read every field at the next reading, as at start-up
        self._fast_plan[slot] = None  # built on the old handle
        self._power_read_at[slot] = float("-inf")
        gpm = self._gpm[slot]
        if gpm is not None:
            gpm.have_prev = False  # the GPU was reset: its counters restarted
        log.warning("GPU %s is back", self._ids[slot].uuid)

    # ------------------------------------------------------------------------------------------ interface

    def node_facts(self) -> NodeFacts:
        return self._facts

    def gpus(self) -> list[GpuIdentity]:
        return list(self._ids)

    def _power_readable(self, slot: int) -> bool:
        """Whether this GPU has a power reading that is not known to be unsupported."""
        name = _POWER_FIELDS.get(self._ids[slot].power_source or "")
        return name is not None and (slot, name) not in self._skip

    def _power_due(self, slot: int) -> bool:
        """Whether a fast reading reads power: every one does, but the driver's 1-s mean is read a second or more
        after its last read (by the interval's reading, or by a fast one)."""
        return (self._ids[slot].power_source != _POWER_FIELD_AVERAGE
                or self._clock() - self._power_read_at[slot] >= POWER_AVERAGE_WINDOW_S)

    def _power_mw(self, slot: int) -> int | None:
        nvml = self._nvml
        handle = self._handles[slot]
        source = self._ids[slot].power_source
        if source in (_POWER_INSTANT, _POWER_FIELD_AVERAGE):
            if source == _POWER_FIELD_AVERAGE:
                self._power_read_at[slot] = self._clock()
            name = _POWER_FIELDS[source]
            ids = self._power_average_ids if source == _POWER_FIELD_AVERAGE else self._power_instant_ids
            values = self._get(slot, name, nvml.nvmlDeviceGetFieldValues, handle, ids)
            if values and values[0].nvmlReturn == nvml.NVML_SUCCESS:
                v = self._field_value(values[0])
                return int(v) if v is not None else None
            if values and values[0].nvmlReturn in self._lost_codes:
                self._lost[slot] = True
                raise GpuLostError(slot, f"{name} field: NVML error {values[0].nvmlReturn}")
            if values:  # as _read_fields does: a field the GPU does not answer is not asked again
                self._note_unsupported(slot, name, f"NVML error {values[0].nvmlReturn}")
            return None
        if source is not None:
            return self._get(slot, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        return None

    # ------------------------------------------------------------------------------------------ power limit

    def _physical_handle(self, slot: int) -> Any:
        if self._ids[slot].mig_parent_uuid is not None:
            raise FieldNotSupportedError(f"GPU slot {slot} is a MIG device: its parent's power limit applies")
        return self._handles[slot]

    def _call(self, slot: int, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            err = map_nvml_error(self._nvml, exc, slot)
            if isinstance(err, GpuLostError):
                self._lost[slot] = True
            raise err from None

    def power_limit_constraints_mw(self, slot: int) -> tuple[int, int]:
        """nvmlDeviceGetPowerManagementLimitConstraints: (min, max) in mW."""
        lo, hi = self._call(slot, self._nvml.nvmlDeviceGetPowerManagementLimitConstraints,
                            self._physical_handle(slot))
        return int(lo), int(hi)

    def set_power_limit_mw(self, slot: int, limit_mw: int) -> None:
        """nvmlDeviceSetPowerManagementLimit, checked against the constraints first (a clear ValueError rather
        than NVML's INVALID_ARGUMENT); NO_PERMISSION becomes DevicePermissionError."""
        lo, hi = self.power_limit_constraints_mw(slot)
        if not lo <= limit_mw <= hi:
            raise ValueError(f"GPU {self._ids[slot].uuid}: power limit {limit_mw / 1000:.0f} W is outside "
                             f"the range the driver accepts, {lo / 1000:.0f}-{hi / 1000:.0f} W")
        self._call(slot, self._nvml.nvmlDeviceSetPowerManagementLimit, self._physical_handle(slot), int(limit_mw))

    def power_limit_mw(self, slot: int) -> int | None:
        if self._ids[slot].mig_parent_uuid is not None:
            return None
        return self._get(slot, "power_limit", self._nvml.nvmlDeviceGetEnforcedPowerLimit, self._handles[slot])

    def read_fast(self, slot: int) -> tuple[int | None, int | None]:
        """10 Hz: memory used and, where due (`_power_due`), power; nothing else. The steady state runs a closure
        built after a first careful reading (one or two NVML calls, no per-field bookkeeping); any error or unusual
        answer falls back to the careful path, which maps, logs and remembers it exactly as before (asking NVML
        once more)."""
        if self._lost[slot]:
            self._revive(slot)
        plan = self._fast_plan[slot]
        if plan is not None:
            try:
                return plan()
            except Exception:  # noqa: BLE001 - the careful path below decides what the error means
                self._fast_plan[slot] = None
        mem = self._memory_info(slot)
        due = self._power_due(slot)
        power = self._power_mw(slot) if due else None
        if mem is not None and (power is not None or not due or not self._power_readable(slot)):
            self._fast_plan[slot] = self._make_fast_plan(slot)
        return (int(mem.used) if mem is not None else None), power

    def _make_fast_plan(self, slot: int) -> Callable[[], tuple[int | None, int | None]]:
        nvml = self._nvml
        h = self._handles[slot]
        mem_fn = nvml.nvmlDeviceGetMemoryInfo
        mem_args = (h, nvml.nvmlMemory_v2) if self._v2_memory[slot] else (h,)
        source = self._ids[slot].power_source if self._power_readable(slot) else None
        if source in (_POWER_INSTANT, _POWER_FIELD_AVERAGE):
            is_mean = source == _POWER_FIELD_AVERAGE  # the driver's 1-s mean: read a second after the last read
            fields_fn, success, value = nvml.nvmlDeviceGetFieldValues, self._success, self._field_value
            ids = self._power_average_ids if is_mean else self._power_instant_ids
            clock, read_at, window = self._clock, self._power_read_at, POWER_AVERAGE_WINDOW_S

            def memory_and_power() -> tuple[int | None, int | None]:
                used = int(mem_fn(*mem_args).used)
                if is_mean:
                    now = clock()
                    if now - read_at[slot] < window:
                        return used, None  # the 1-s mean read last still covers this moment
                (fv,) = fields_fn(h, ids)
                v = value(fv) if fv.nvmlReturn == success else None
                if v is None:
                    raise ValueError("power field not read")  # -> the careful path, which asks again
                if is_mean:
                    read_at[slot] = now
                return used, int(v)

            return memory_and_power
        if source == _POWER_AVERAGE:
            power_fn = nvml.nvmlDeviceGetPowerUsage

            def average() -> tuple[int | None, int | None]:
                return int(mem_fn(*mem_args).used), power_fn(h)

            return average

        def memory_only() -> tuple[int | None, int | None]:
            return int(mem_fn(*mem_args).used), None

        return memory_only

    def _due(self, n: int, slot: int, every: int) -> bool:
        """Whether a field read every `every` readings is due at reading `n` of `slot` (staggered by slot)."""
        return n == 0 or n % every == slot % every

    def read(self, slot: int) -> GpuReading:
        if self._lost[slot]:
            self._revive(slot)
        nvml = self._nvml
        h = self._handles[slot]
        g = self._get
        n = self._reads[slot]
        self._reads[slot] = n + 1
        slow = self._due(n, slot, self._slow_every)
        health = self._due(n, slot, self._health_every)
        r = GpuReading()
        # every interval: a few microseconds each
        mem = self._memory_info(slot)
        if mem is not None:
            r.memory_used_bytes = int(mem.used)
            r.memory_total_bytes = int(mem.total)
            r.memory_reserved_bytes = int(mem.reserved) if hasattr(mem, "reserved") else None
        util = g(slot, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r.gpu_util_pct = float(util.gpu)
            r.mem_util_pct = float(util.memory)
        if self._ids[slot].power_source == _POWER_AVERAGE:
            r.power_mw = g(slot, "power", nvml.nvmlDeviceGetPowerUsage, h)
        # ECC, instantaneous power, NVLink; energy when slow-due, volatile ECC when health is due
        self._read_fields(slot, r, energy=slow, health=health)
        if self._ids[slot].power_source == _POWER_FIELD_AVERAGE:
            self._power_read_at[slot] = self._clock()  # the next fast reading due a second from now
        temp = g(slot, "temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        r.temperature_c = float(temp) if temp is not None else None
        sm = g(slot, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        r.sm_clock_mhz = float(sm) if sm is not None else None
        mc = g(slot, "mem_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
        r.mem_clock_mhz = float(mc) if mc is not None else None
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        r.throttle_reasons = g(slot, "throttle_reasons", reasons_fn, h)
        physical = self._ids[slot].mig_parent_uuid is None  # a MIG device has no power limit or clocks of its own
        if physical:
            r.power_limit_mw = g(slot, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)  # 2 us
        # every `slow_every` readings: PCIe throughput samples for 20 ms inside the driver per direction; null
        # in between (a rate over another 20 ms window is not this row's)
        if slow and self._gpm[slot] is None:  # a GPM GPU's PCIe rates come from GPM, every reading (below)
            tx = g(slot, "pcie_tx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = g(slot, "pcie_rx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_RX_BYTES)
            r.pcie_tx_kib_per_s = float(tx) if tx is not None else None
            r.pcie_rx_kib_per_s = float(rx) if rx is not None else None
        # every `static_every` readings: application clocks (~1 ms each); the last value read on every row
        if physical:
            if self._due(n, slot, self._static_every):
                app_sm = g(slot, "app_sm_clock", nvml.nvmlDeviceGetApplicationsClock, h, nvml.NVML_CLOCK_SM)
                app_mem = g(slot, "app_mem_clock", nvml.nvmlDeviceGetApplicationsClock, h, nvml.NVML_CLOCK_MEM)
                self._app_clocks[slot] = (float(app_sm) if app_sm is not None else None,
                                          float(app_mem) if app_mem is not None else None)
            r.app_sm_clock_mhz, r.app_mem_clock_mhz = self._app_clocks[slot]
            if health:
                self._read_health(slot, r)
        if self._gpm[slot] is not None:
            self._read_gpm(slot, r)
            # the interval's PCIe and NVLink rates, from GPM (null at the first reading and if GPM failed)
            r.pcie_tx_kib_per_s = _scaled(r.gpm_pcie_tx_bytes_per_s, 1 / _KIB)
            r.pcie_rx_kib_per_s = _scaled(r.gpm_pcie_rx_bytes_per_s, 1 / _KIB)
            r.nvlink_tx_kib_per_s = _scaled(r.gpm_nvlink_tx_bytes_per_s, 1 / _KIB)
            r.nvlink_rx_kib_per_s = _scaled(r.gpm_nvlink_rx_bytes_per_s, 1 / _KIB)
        return r

    def _read_gpm(self, slot: int, r: GpuReading) -> None:
        """This reading's GPM sample, and the metrics between it and the previous reading's (no sleeping: the
        interval between two readings is the GPM window). A GPU that turns out not to support it is not asked
        again; a transient failure starts the pair anew."""
        state = self._gpm[slot]
        assert state is not None
        nvml = self._nvml
        try:
            self._call(slot, nvml.nvmlGpmSampleGet, self._handles[slot], state.cur)
            if state.have_prev:
                request = state.request
                request.sample1, request.sample2 = state.prev, state.cur
                self._call(slot, nvml.nvmlGpmMetricsGet, request)
                success = self._success
                field = _c_field  # the ctypes field itself, past pynvml's Python __getattribute__
                for m, attr, factor in state.metrics:
                    if field(m, "nvmlReturn") == success:
                        setattr(r, attr, field(m, "value") * factor)
        except (FieldNotSupportedError, DevicePermissionError) as err:
            self._gpm[slot] = None
            self._free_gpm(state)
            self._note_unsupported(slot, "gpm", str(err))
            return
        except GpuLostError:
            state.have_prev = False
            raise
        except DeviceError as err:
            state.have_prev = False
            if (slot, "gpm") not in self._warned:
                self._warned.add((slot, "gpm"))
                log.warning("GPU %s: reading GPM failed: %s", self._ids[slot].uuid, err)
            return
        state.prev, state.cur = state.cur, state.prev
        state.have_prev = True

    def _free_gpm(self, state: _Gpm) -> None:
        for sample in (state.prev, state.cur):
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError as exc:
                log.debug("nvmlGpmSampleFree: %s", exc)

    def _read_health(self, slot: int, r: GpuReading) -> None:
        """The rarely changing health counters (volatile ECC comes with the field values). Each is null where the
        GPU lacks it: H100s retire no pages (they remap rows), A100s and H100s have both ECC kinds."""
        nvml = self._nvml
        h = self._handles[slot]
        g = self._get
        sbe = g(slot, "retired_pages", nvml.nvmlDeviceGetRetiredPages, h,
                nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        if sbe is not None:
            dbe = g(slot, "retired_pages", nvml.nvmlDeviceGetRetiredPages, h,
                    nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            r.retired_pages_sbe = len(sbe)
            r.retired_pages_dbe = None if dbe is None else len(dbe)
            pending = g(slot, "retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
            r.retired_pages_pending = None if pending is None else int(pending == nvml.NVML_FEATURE_ENABLED)
        rows = g(slot, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending_rows, failed = rows
            r.remapped_rows_correctable, r.remapped_rows_uncorrectable = int(corr), int(unc)
            r.remapped_rows_pending, r.remapped_rows_failed = int(bool(pending_rows)), int(bool(failed))
        replay = g(slot, "pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter, h)
        r.pcie_replay_total = None if replay is None else int(replay)

    def _read_fields(self, slot: int, r: GpuReading, *, energy: bool = True, health: bool = True) -> None:
        """ECC totals, instantaneous power, the NVLink counters and (`energy`) the energy counter in one
        nvmlDeviceGetFieldValues call (one ioctl instead of 2N+4). The energy field alone costs ~3 ms of
        driver CPU on an H100, hence `energy` only every `slow_every` readings. A field the GPU lacks is null,
        logged once, and not asked again."""
        nvml = self._nvml
        if self._ids[slot].mig_parent_uuid is not None:
            return  # energy, ECC and NVLink are the parent GPU's
        scalars = [(name, attr, getattr(nvml, const)) for name, const, attr in _SCALAR_FIELDS
                   if (slot, name) not in self._skip and hasattr(nvml, const)
                   and (energy or name not in _SLOW_FIELDS) and (health or name not in _HEALTH_FIELDS)
                   and (name != "power_instant" or self._ids[slot].power_source == _POWER_INSTANT)
                   and (name != "power_average" or self._ids[slot].power_source == _POWER_FIELD_AVERAGE)
                   and (attr != _NVLINK_ERRORS or self._nvlink_links[slot] > 0)]
        # a GPM GPU's NVLink rates come from GPM (over the interval, all links): its 2 x links counters are not read
        links = [] if (slot, "nvlink") in self._skip or self._gpm[slot] is not None else self._nvlink_fields[slot]
        ids: list[Any] = [fid for _, _, fid in scalars] + links
        if not ids:
            return
        values = self._get(slot, "field_values", nvml.nvmlDeviceGetFieldValues, self._handles[slot], ids)
        if values is None:
            return
        success, value = self._success, self._field_value
        for (name, attr, _), fv in zip(scalars, values, strict=False):
            if fv.nvmlReturn == success:
                v = value(fv)
                if attr == _NVLINK_ERRORS:  # the sum of the error kinds the GPU keeps
                    if v is not None:
                        r.nvlink_errors_total = (r.nvlink_errors_total or 0) + int(v)
                else:
                    setattr(r, attr, None if v is None else int(v))
            elif fv.nvmlReturn in self._lost_codes:
                self._lost[slot] = True
                raise GpuLostError(slot, f"{name} field: NVML error {fv.nvmlReturn}")
            else:
                self._note_unsupported(slot, name, f"NVML error {fv.nvmlReturn}")
        if links:
            tx = rx = 0
            ok = False
            tx_field = nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            for fv in values[len(scalars):]:
                if fv.nvmlReturn != success:
                    continue
                ok = True
                v = int(value(fv) or 0)
                if fv.fieldId == tx_field:
                    tx += v
                else:
                    rx += v
            if ok:
                now = self._clock()
                prev = self._nvlink_prev.get(slot)
                self._nvlink_prev[slot] = (now, tx, rx)
                if prev is not None and now > prev[0] and tx >= prev[1] and rx >= prev[2]:
                    r.nvlink_tx_kib_per_s = (tx - prev[1]) / (now - prev[0])
                    r.nvlink_rx_kib_per_s = (rx - prev[2]) / (now - prev[0])
            else:
                self._note_unsupported(slot, "nvlink", "throughput counters not supported")

    def processes(self, slot: int) -> list[GpuProcess]:
        nvml = self._nvml
        h = self._handles[slot]
        used: dict[int, int | None] = {}
        for field, fn in (("compute_processes", nvml.nvmlDeviceGetComputeRunningProcesses),
                          ("graphics_processes", nvml.nvmlDeviceGetGraphicsRunningProcesses)):
            for p in self._get(slot, field, fn, h) or ():
                mem = p.usedGpuMemory
                prev = used.get(p.pid)
                # a process with a compute and a graphics context is listed twice with the same memory
                used[int(p.pid)] = mem if prev is None else max(prev, mem or 0)
        return [GpuProcess(pid, None if m is None else int(m)) for pid, m in used.items()]

    def xid_events(self) -> list[tuple[int, int]]:
        nvml = self._nvml
        if self._event_set is None:
            return []
        out: list[tuple[int, int]] = []
        while True:
            try:
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                    log.debug("nvmlEventSetWait: %s", exc)
                return out
            slot = self._event_slots.get(_handle_key(data.device))
            if slot is not None and data.eventType & nvml.nvmlEventTypeXidCriticalError:
                log.warning("GPU %s: XID %d", self._ids[slot].uuid, data.eventData)
                out.append((slot, int(data.eventData)))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        nvml = self._nvml
        for state in getattr(self, "_gpm", ()):
            if state is not None:
                self._free_gpm(state)
        try:
            if getattr(self, "_event_set", None) is not None:
                nvml.nvmlEventSetFree(self._event_set)
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
