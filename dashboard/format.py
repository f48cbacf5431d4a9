"""Numbers as the dashboard prints them: always with a unit, and "unknown" (never 0) for a missing value."""

from __future__ import annotations

from datetime import datetime, timezone

UNKNOWN = "unknown"
GIB = 2**30


def gib(n_bytes: float | None, digits: int = 2) -> str:
    return UNKNOWN if n_bytes is None else f"{n_bytes / GIB:,.{digits}f} GiB"


def pct(value: float | None, digits: int = 1) -> str:
    return UNKNOWN if value is None else f"{value:.{digits}f} %"


def fraction_pct(value: float | None, digits: int = 1) -> str:
    return UNKNOWN if value is None else f"{100.0 * value:.{digits}f} %"


def watts(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:,.1f} W"


def energy(joules: float | None) -> str:
    """Joules, shown as kWh beyond 1 MJ (operators think in kWh), else kJ or J."""
    if joules is None:
        return UNKNOWN
    if abs(joules) >= 1e6:
        return f"{joules / 3.6e6:,.2f} kWh"
    if abs(joules) >= 1e3:
        return f"{joules / 1e3:,.1f} kJ"
    return f"{joules:,.1f} J"


def seconds(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    if value < 1.0:
        return f"{value * 1e3:,.1f} ms"
    if value < 120.0:
        return f"{value:,.2f} s"
    if value < 7200.0:
        return f"{value / 60:,.1f} min"
    return f"{value / 3600:,.1f} h"


def grams(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    return f"{value / 1e3:,.2f} kg CO2e" if value >= 1e3 else f"{value:,.1f} g CO2e"


def usd(value: float | None) -> str:
    """Dollars; a negative amount (a 'saving' that costs more) as -$1.23."""
    if value is None:
        return UNKNOWN
    sign, v = ("-" if value < 0 else ""), abs(value)
    return f"{sign}${v:,.2f}" if v >= 0.01 or v == 0 else f"{sign}${v:,.4f}"


def count(value: int | float | None, unit: str = "") -> str:
    if value is None:
        return UNKNOWN
    text = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    return f"{text} {unit}".rstrip()


def hours(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:,.1f} GPU-h"


def timestamp(epoch_s: float | None) -> str:
    if epoch_s is None:
        return UNKNOWN
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


ENERGY_SOURCES = {
    "hardware_counter": "NVML energy counter",
    "integrated_power": "integrated power",
    "mixed": "NVML energy counter + integrated power",
    "unrecorded": "source not recorded",
}


def energy_source(value: str | None) -> str:
    """Where an energy figure came from, in words: the hardware counter (exact) or integrated power samples."""
    return UNKNOWN if not value else ENERGY_SOURCES.get(value, value.replace("_", " "))


# The report's `sources` values, in words (prefix before ":" -> words; the rest is kept as detail).
SOURCES = {
    "nvml": "NVML",
    "cuda_allocator": "PyTorch caching allocator (max_memory_allocated/reserved per step)",
    "cpu_rss": "process RSS (CPU run)",
    "framework": "framework hooks",
    "framework:reserved-allocated": "framework allocator: reserved − allocated",
    "telemetry": "detected in NVML telemetry",
    "kineto": "Kineto trace",
    "energy/framework_steps": "job energy / framework steps",
    **{k: v for k, v in ENERGY_SOURCES.items()},
}


def source(value: str | None) -> str | None:
    """A figure's source in words, e.g. "nvml:gpu_util_pct" -> "NVML (gpu_util_pct)"; None stays None."""
    if not value:
        return None
    if value in SOURCES:
        return SOURCES[value]
    head, _, detail = value.partition(":")
    return f"{SOURCES[head]} ({detail})" if head in SOURCES and detail else value


def text(value: object) -> str:
    """A user-supplied string for display (Dash escapes it; this only maps None to 'unknown')."""
    return UNKNOWN if value is None or value == "" else str(value)
