"""Numbers and sources as the dashboard prints them: always with a unit, and "unknown" (never 0) for a missing value."""

from __future__ import annotations

# The formatters (units, sources in words) are shared with `fleetprof report` and the HTML report
# (fleetprof.units).
from fleetprof.units import (  # noqa: F401 - re-exported: the dashboard's pages use them as fmt.*
    GIB,
    UNKNOWN,
    by_key,
    count,
    energy,
    energy_source,
    fraction_pct,
    gib,
    grams,
    hours,
    pct,
    seconds,
    size,
    source,
    timestamp,
    usd,
    watts,
)


def text(value: object) -> str:
    """A user-supplied string for display (Dash escapes it; this only maps None to 'unknown')."""
    return UNKNOWN if value is None or value == "" else str(value)


def bytes_per_s(value: float | None) -> str:
    """A data rate (PCIe, NVLink) in the binary unit that reads best, e.g. "15.34 MiB/s"."""
    return UNKNOWN if value is None else f"{size(value)}/s"
