"""The exported series: dcgm-exporter's field names, Prometheus types and units (etc/default-counters.csv and
etc/dcp-metrics-included.csv of NVIDIA/dcgm-exporter), each read from one attribute of the agent's `GpuReading`.

DCGM's units differ from ours: framebuffer in MiB, energy in mJ, power in W, and the profiling (DCP) fields are
ratios 0-1 where NVML's GPM gives percent. Where DCGM has no field for what we read (the sum of a GPU's NVLink
error counters, which DCGM exports per kind), the series carries a `fleetprof_gpu_` name instead of a made-up
DCGM one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MIB = 2**20


@dataclass(frozen=True)
class ExportedField:
    name: str  # the Prometheus metric name
    kind: Literal["gauge", "counter"]
    source: str  # attribute of GpuReading (device units), or one the gauges derive (memory_free_bytes, xid_last)
    scale: float  # multiplies the source value into the exported unit
    help: str


def _f(name: str, kind: Literal["gauge", "counter"], source: str, scale: float, help_text: str) -> ExportedField:
    return ExportedField(name, kind, source, scale, help_text)


FIELDS: tuple[ExportedField, ...] = (
    _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "gpu_util_pct", 1.0, "GPU utilization (in %)."),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "mem_util_pct", 1.0, "Memory utilization (in %)."),
    _f("DCGM_FI_DEV_FB_USED", "gauge", "memory_used_bytes", 1 / MIB, "Framebuffer memory used (in MiB)."),
    _f("DCGM_FI_DEV_FB_FREE", "gauge", "memory_free_bytes", 1 / MIB, "Framebuffer memory free (in MiB)."),
    _f("DCGM_FI_DEV_FB_RESERVED", "gauge", "memory_reserved_bytes", 1 / MIB, "Framebuffer memory reserved (in MiB)."),
    _f("DCGM_FI_DEV_POWER_USAGE", "gauge", "power_mw", 1e-3, "Power draw (in W)."),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "power_limit_mw", 1e-3, "Power management limit (in W)."),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "energy_mj", 1.0,
       "Total energy consumption since boot (in mJ)."),
    _f("DCGM_FI_DEV_GPU_TEMP", "gauge", "temperature_c", 1.0, "GPU temperature (in C)."),
    _f("DCGM_FI_DEV_SM_CLOCK", "gauge", "sm_clock_mhz", 1.0, "SM clock frequency (in MHz)."),
    _f("DCGM_FI_DEV_MEM_CLOCK", "gauge", "mem_clock_mhz", 1.0, "Memory clock frequency (in MHz)."),
    _f("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "throttle_reasons", 1.0,
       "Current clock throttle reasons (bitmask of NVML clock-event reasons)."),
    _f("DCGM_FI_DEV_XID_ERRORS", "gauge", "xid_last", 1.0, "Value of the last XID error encountered."),
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "ecc_corrected_volatile", 1.0,
       "Total number of single-bit volatile ECC errors."),
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "ecc_uncorrected_volatile", 1.0,
       "Total number of double-bit volatile ECC errors."),
    _f("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "ecc_corrected_total", 1.0,
       "Total number of single-bit persistent ECC errors."),
    _f("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "ecc_uncorrected_total", 1.0,
       "Total number of double-bit persistent ECC errors."),
    _f("DCGM_FI_DEV_RETIRED_SBE", "counter", "retired_pages_sbe", 1.0,
       "Total number of retired pages due to single-bit errors."),
    _f("DCGM_FI_DEV_RETIRED_DBE", "counter", "retired_pages_dbe", 1.0,
       "Total number of retired pages due to double-bit errors."),
    _f("DCGM_FI_DEV_RETIRED_PENDING", "counter", "retired_pages_pending", 1.0,
       "Total number of pages pending retirement."),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "remapped_rows_correctable", 1.0,
       "Number of remapped rows for correctable errors"),
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "remapped_rows_uncorrectable", 1.0,
       "Number of remapped rows for uncorrectable errors"),
    _f("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "remapped_rows_pending", 1.0,
       "Whether remapping of rows is pending (1) or not (0)"),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "remapped_rows_failed", 1.0, "Whether remapping of rows has failed"),
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "pcie_replay_total", 1.0, "Total number of PCIe retries."),
    _f("fleetprof_gpu_nvlink_errors_total", "counter", "nvlink_errors_total", 1.0,
       "NVLink CRC flit + CRC data + replay + recovery errors, summed over links (DCGM exports them per kind)."),
    # DCP (profiling) fields from NVML's GPM (Hopper and later): percent there, ratio 0-1 as DCGM gives them.
    _f("DCGM_FI_PROF_SM_ACTIVE", "gauge", "gpm_sm_activity_pct", 0.01,
       "The ratio of cycles an SM has at least 1 warp assigned."),
    _f("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "gpm_sm_occupancy_pct", 0.01,
       "The ratio of number of warps resident on an SM."),
    _f("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "gpm_tensor_activity_pct", 0.01,
       "Ratio of cycles the tensor (HMMA) pipe is active."),
    _f("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "gpm_dram_bw_util_pct", 0.01,
       "Ratio of cycles the device memory interface is active sending or receiving data."),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "gpm_pcie_tx_bytes_per_s", 1.0,
       "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
       "in bytes per second."),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "gpm_pcie_rx_bytes_per_s", 1.0,
       "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in "
       "bytes per second."),
    _f("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "gpm_nvlink_tx_bytes_per_s", 1.0,
       "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second."),
    _f("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "gpm_nvlink_rx_bytes_per_s", 1.0,
       "The rate of data received over NVLink, not including protocol headers, in bytes per second."),
)

# Read by the exporter from each full reading: every source above but the two the gauges derive themselves.
READING_SOURCES: tuple[str, ...] = tuple(f.source for f in FIELDS if f.source not in ("memory_free_bytes",
                                                                                         "xid_last"))
