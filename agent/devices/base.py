"""The agent's GPU device interface, its value types and its exceptions.

Modelled on Zeus (`zeus/device/gpu`): a vendor library sits behind this interface, every vendor error is
mapped to one of the exceptions below, and units are in every name. Inside the device layer power is in
milliwatts and energy in millijoules, as NVML reports them; the sampler converts to the protocol's watts
and joules at the edge.

A device set addresses its GPUs by *slot*: the position in `gpus()`. MIG devices are slots of their own,
after their parent's, with `mig_parent_uuid` set.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from fleetprof.protocol import SampleSource


class DeviceError(Exception):
    """Base class of every error raised by a device implementation."""


class DeviceUnavailableError(DeviceError):
    """The device library or driver cannot be used at all (no library, driver not loaded, no GPU)."""


class FieldNotSupportedError(DeviceError):
    """This GPU (or driver) does not provide the field. Callers record None."""


class DevicePermissionError(DeviceError):
    """The driver refused the query (e.g. processes of other users without privileges)."""


class GpuLostError(DeviceError):
    """The GPU fell off the bus, needs a reset, or the driver failed for it: mark it unhealthy."""

    def __init__(self, slot: int, message: str):
        super().__init__(f"GPU slot {slot}: {message}")
        self.slot = slot


@dataclass(frozen=True)
class GpuIdentity:
    """Static facts about one GPU or MIG device."""

    slot: int
    index: int  # the driver's index of the physical GPU (a MIG device carries its parent's)
    uuid: str
    name: str
    memory_total_bytes: int | None = None
    pci_bus_id: str | None = None
    mig_parent_uuid: str | None = None
    # A MIG device's GPU instance id (nvmlDeviceGetGpuInstanceId) and profile ("1g.10gb", from its name): the
    # GPU_I_ID and GPU_I_PROFILE labels dcgm-exporter gives MIG series; None on a whole GPU
    mig_gpu_instance_id: int | None = None
    mig_profile: str | None = None
    # Which call feeds power_mw: "field:NVML_FI_DEV_POWER_AVERAGE" (the driver's 1-s mean),
    # "field:NVML_FI_DEV_POWER_INSTANT", "nvmlDeviceGetPowerUsage" (a 1-s mean on Ampere+ but GA100,
    # instantaneous on older parts), "nvidia-smi:power.draw" (replay); None = no power.
    power_source: str | None = None
    power_limit_mw: int | None = None
    default_power_limit_mw: int | None = None
    max_sm_clock_mhz: float | None = None  # nvmlDeviceGetMaxClockInfo(SM)
    slowdown_temperature_c: float | None = None  # nvmlDeviceGetTemperatureThreshold(SLOWDOWN)


@dataclass(frozen=True)
class NodeFacts:
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_version: str | None = None


@dataclass
class GpuReading:
    """One full reading of one GPU. None = unsupported or unknown."""

    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    power_mw: int | None = None
    energy_mj: int | None = None  # cumulative since driver load (Volta+)
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: int | None = None
    pcie_tx_kib_per_s: float | None = None
    pcie_rx_kib_per_s: float | None = None
    # from the per-link cumulative data counters (summed over links), as deltas between readings
    nvlink_tx_kib_per_s: float | None = None
    nvlink_rx_kib_per_s: float | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    power_limit_mw: int | None = None  # enforced now (nvmlDeviceGetEnforcedPowerLimit)
    app_sm_clock_mhz: float | None = None  # application clocks (nvmlDeviceGetApplicationsClock)
    app_mem_clock_mhz: float | None = None
    # GPM (Hopper+): over the interval since the previous GPM sample; None without GPM or at the first reading
    gpm_sm_activity_pct: float | None = None
    gpm_sm_occupancy_pct: float | None = None
    gpm_tensor_activity_pct: float | None = None
    gpm_dram_bw_util_pct: float | None = None
    gpm_pcie_tx_bytes_per_s: float | None = None
    gpm_pcie_rx_bytes_per_s: float | None = None
    gpm_nvlink_tx_bytes_per_s: float | None = None
    gpm_nvlink_rx_bytes_per_s: float | None = None
    # health counters (cumulative; flags 0/1), read every `health_every` readings, None in between
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: int | None = None
    remapped_rows_failed: int | None = None
    pcie_replay_total: int | None = None
    nvlink_errors_total: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None
    # Set only by sources that already know the job (a replayed recording); live sources leave it to
    # the attributor.
    job_id: str | None = None
    attribution: str | None = None


class Devices(abc.ABC):
    """A node's GPUs. Implementations: `NvmlDevices` (live), `ReplayDevices` (a recording as if live)."""

    #: the protocol's batch `source` for data from this device set
    source: SampleSource = "nvml"
    #: whether process ids are this host's (so /proc attribution applies); a replay's are not
    local_pids: bool = True

    @abc.abstractmethod
    def node_facts(self) -> NodeFacts: ...

    @abc.abstractmethod
    def gpus(self) -> list[GpuIdentity]: ...

    @abc.abstractmethod
    def read(self, slot: int) -> GpuReading:
        """A full reading. Raises GpuLostError when the GPU is gone; unsupported fields are None."""

    @abc.abstractmethod
    def read_fast(self, slot: int) -> tuple[int | None, int | None]:
        """(memory_used_bytes, power_mw): the cheap pair sampled between full readings for peaks."""

    @abc.abstractmethod
    def processes(self, slot: int) -> list[GpuProcess]: ...

    def power_limit_constraints_mw(self, slot: int) -> tuple[int, int]:
        """(min, max) power limit the driver accepts for this GPU, in mW. FieldNotSupportedError when the
        device set cannot set limits (a replay, a MIG device)."""
        raise FieldNotSupportedError("this device set cannot set power limits")

    def set_power_limit_mw(self, slot: int, limit_mw: int) -> None:
        """Set the GPU's power management limit (mW). ValueError outside the constraints;
        DevicePermissionError without the privilege (root or CAP_SYS_ADMIN on Linux); FieldNotSupportedError
        where the GPU or device set cannot."""
        raise FieldNotSupportedError("this device set cannot set power limits")

    def power_limit_mw(self, slot: int) -> int | None:
        """The limit the driver enforces now (mW); None when unknown."""
        return None

    def xid_events(self) -> list[tuple[int, int]]:
        """(slot, xid) of XID errors since the last call; never blocks."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the library (idempotent)."""
