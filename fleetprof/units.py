"""Numbers as fleetprof shows them to people: always with their unit, and "unknown" (never 0) for a missing value.

One module for every place that prints report figures (the dashboard, `fleetprof report`'s table, the standalone
HTML report), in the bare package so a GPU node's CLI has it without the server or the dashboard. A report key
names its unit by its suffix (PRODUCT.md: `_bytes`, `_s`, `_w`, `_j`, `_pct`, `_fraction`, `_mhz`, ...);
`by_key` formats a value by its key, and a nested dict without suffixes of its own (`step_time_s: {p50, p95}`)
takes its parent's unit.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

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
    if abs(value) < 1e-3 and value != 0:
        return f"{value * 1e6:,.1f} us"
    if abs(value) < 1.0:
        return f"{value * 1e3:,.1f} ms"
    if abs(value) < 120.0:
        return f"{value:,.2f} s"
    if abs(value) < 7200.0:
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


def size(n_bytes: float | None) -> str:
    """Bytes in the binary unit that reads best: GiB for device memory, MiB or KiB for a layer's activations."""
    if n_bytes is None:
        return UNKNOWN
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:,.2f} {unit}"
    return f"{n_bytes:,.0f} B"


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
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _plain(value: float) -> str:
    return count(value) if float(value).is_integer() else f"{value:,.4g}"


# Key suffix -> formatter, most specific first: `samples_per_s` is a rate, not a duration.
_BY_SUFFIX: list[tuple[str, Callable[[float], str]]] = [
    ("_bytes_per_s", lambda v: f"{v / GIB:,.2f} GiB/s"),
    ("_g_per_kwh", lambda v: f"{v:,.0f} g CO2e/kWh"),
    ("_per_kwh_usd", lambda v: f"{usd(v)}/kWh"),
    ("_per_s", lambda v: f"{_plain(v)} /s"),
    ("_bytes", size),
    ("_us", lambda v: seconds(v / 1e6)),
    ("_ms", lambda v: seconds(v / 1e3)),
    ("_s", seconds),
    ("_pct", pct),
    ("_fraction", fraction_pct),
    ("_w", watts),
    ("_j", energy),
    ("_kwh", lambda v: f"{v:,.4g} kWh"),
    ("_mhz", lambda v: f"{v:,.0f} MHz"),
    ("usd_per_gpu_hour", lambda v: f"{usd(v)} per GPU-hour"),
    ("usd", usd),  # `usd` itself (a saving's dollars) and `..._usd`
    ("_g", grams),
    ("_c", lambda v: f"{v:,.0f} °C"),
]

# Key suffix -> the unit's symbol, for an API field that names the unit of a series (`unit: "B"`).
_SYMBOL = {"_bytes_per_s": "B/s", "_per_s": "/s", "_bytes": "B", "_us": "us", "_ms": "ms", "_s": "s", "_pct": "%",
           "_w": "W", "_j": "J", "_kwh": "kWh", "_mhz": "MHz", "_g": "g", "_c": "°C"}


def unit_suffix(key: str) -> str | None:
    """The unit suffix `key` ends with, if any (`peak_used_bytes` -> `_bytes`); a key that is the unit itself
    (`usd`, `bytes`) counts too."""
    for suffix, _ in _BY_SUFFIX:
        if key.endswith(suffix) or key == suffix.removeprefix("_"):
            return suffix
    return None


def unit_symbol(key: str) -> str | None:
    """The symbol of the unit `key` names by its suffix (`memory_used_bytes` -> `B`), None when it names none."""
    suffix = unit_suffix(key)
    return _SYMBOL.get(suffix) if suffix else None


_FORMAT = dict(_BY_SUFFIX)


def by_key(key: str, value: Any, *, parent_suffix: str | None = None) -> str:
    """`value` of report key `key`, with the unit its name (or, for unit-less children, its parent's) says.

    Dicts become `name value, ...` on one line; a list of scalars is joined; a list of records says how many
    rows it holds (tables print those as tables of their own). Booleans are yes/no; strings as they are."""
    suffix = unit_suffix(key) or parent_suffix
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _FORMAT[suffix](value) if suffix else _plain(value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {by_key(k, v, parent_suffix=suffix)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        if not value:
            return "none"
        if all(isinstance(v, dict) for v in value):
            return f"{len(value)} rows"
        return ", ".join(by_key(key, v, parent_suffix=suffix) for v in value)
    return str(value)


def is_records(value: Any) -> bool:
    """A list of records (layers, per-rank figures, GPUs): shown as a table of its own."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def is_nested(value: Any) -> bool:
    """A section holding sections or records of its own: shown indented, not on one line."""
    return isinstance(value, dict) and any(isinstance(v, dict) or is_records(v) for v in value.values())


def cell(key: str, value: Any, *, parent_suffix: str | None = None, in_record: bool = False) -> str:
    """One figure of a report as text; a series (a long list, or numbers in a record) says only how long it is."""
    numbers = isinstance(value, list) and bool(value) and all(isinstance(v, (int, float)) for v in value)
    if isinstance(value, list) and (len(value) > 8 or (in_record and numbers)):
        return f"{len(value):,} points"
    return by_key(key, value, parent_suffix=parent_suffix)


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
    "nvml_max": "NVML (maxima of the 10 Hz readings between samples)",
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

