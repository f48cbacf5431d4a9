"""NVML clock-event ("throttle") reasons: which bits are slowdowns, per sample.

The bit values are NVML's (`nvmlClocksEventReason*`, formerly `nvmlClocksThrottleReason*`, nvml.h). Only some
bits mean the GPU ran slower than it could have for the work it had:

| bit | NVML name | here |
|---|---|---|
| 0x1 | GpuIdle | not a slowdown: nothing to run, clocks drop by design |
| 0x2 | ApplicationsClocksSetting (UserDefinedClocks) | not a slowdown: clocks someone chose |
| 0x4 | SwPowerCap | `power_cap` |
| 0x8 | HwSlowdown | `hw_slowdown` (when no thermal or power-brake bit explains it: the driver sets it beside them) |
| 0x10 | SyncBoost | not a slowdown: clocks held in step with other GPUs |
| 0x20 | SwThermalSlowdown | `thermal` |
| 0x40 | HwThermalSlowdown | `thermal` |
| 0x80 | HwPowerBrakeSlowdown | `power_cap` (external power brake) |
| 0x100 | DisplayClockSetting | not a slowdown |
"""

from __future__ import annotations

import numpy as np

GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

THERMAL = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
POWER_CAP = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN
# The finding kinds, in the order a sample with several bits is named (thermal explains an HW slowdown too).
SLOWDOWN_KINDS: dict[str, int] = {"thermal": THERMAL, "power_cap": POWER_CAP, "hw_slowdown": HW_SLOWDOWN}
SLOWDOWN_BITS = THERMAL | POWER_CAP | HW_SLOWDOWN
NOT_SLOWDOWN_BITS = GPU_IDLE | APPLICATIONS_CLOCKS_SETTING | SYNC_BOOST | DISPLAY_CLOCK_SETTING

BIT_NAMES: dict[int, str] = {
    GPU_IDLE: "gpu_idle", APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting", SW_POWER_CAP: "sw_power_cap",
    HW_SLOWDOWN: "hw_slowdown", SYNC_BOOST: "sync_boost", SW_THERMAL_SLOWDOWN: "sw_thermal_slowdown",
    HW_THERMAL_SLOWDOWN: "hw_thermal_slowdown", HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake_slowdown",
    DISPLAY_CLOCK_SETTING: "display_clock_setting",
}


def as_bits(reasons: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bitmask as int64, known) from a float column where NaN is an unknown reading."""
    r = np.asarray(reasons, dtype=np.float64)
    known = ~np.isnan(r)
    return np.where(known, r, 0).astype(np.int64), known


def slowdown_masks(reasons: np.ndarray) -> dict[str, np.ndarray]:
    """Per kind of SLOWDOWN_KINDS, which samples carry it. A sample is counted under one kind only: thermal
    first, then power cap, then an HW slowdown that neither explains. Unknown readings carry none."""
    bits, known = as_bits(reasons)
    taken = np.zeros(bits.shape, dtype=bool)
    out: dict[str, np.ndarray] = {}
    for kind, mask in SLOWDOWN_KINDS.items():
        m = known & ((bits & mask) != 0) & ~taken
        out[kind] = m
        taken |= m
    return out


def any_slowdown(reasons: np.ndarray) -> np.ndarray:
    """Samples with any slowdown bit (idle, application-clock, sync-boost and display bits are not)."""
    bits, known = as_bits(reasons)
    return known & ((bits & SLOWDOWN_BITS) != 0)


def names(bitmask: int) -> list[str]:
    """The NVML names of the bits set in `bitmask` (unknown bits as hex)."""
    out = [name for bit, name in BIT_NAMES.items() if bitmask & bit]
    rest = bitmask & ~sum(BIT_NAMES)
    if rest:
        out.append(hex(rest))
    return out
