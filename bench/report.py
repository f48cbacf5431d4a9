"""What every benchmark leaves besides its printed table: its figures as one JSON object in
`bench/out/<script>.json`, so that a program can read a figure as well as a person.

    {"name": "ingest", "date": "2026-11-25T12:00:00+00:00",
     "machine": {"cpu_count": 2, "cpu_model": "...", "memory_bytes": ..., "python": "3.11.9", "system": "Linux x86_64"},
     "figures": {"sustained_samples_per_s": 41250.0, "latency_p99_ms": 12.5, ...}}

A figure's key names its unit by its suffix, as report keys do (fleetprof.units: `_ms`, `_s`, `_bytes`, `_per_s`,
`_pct`, `_fraction`, `_j`, `_w`, ...), or says that it is a plain number (`_count`, `_ratio`) or a verdict (`_ok`).
A number whose key names no unit is refused. Unknown is null, never 0 (NaN is written as null). Nested objects
group figures (per trace, per page); their keys are names, their leaves follow the same rule. The machine is
described without its hostname.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetprof.units import unit_suffix

OUT_DIR = Path(__file__).resolve().parent / "out"
# Suffixes of figures that have no physical unit: how many of something, a ratio of two like figures, a verdict.
PLAIN_SUFFIXES = ("_count", "_ratio", "_ok")


def has_unit(key: str) -> bool:
    """Whether `key` names the unit of its number (`p99_ms`, `samples_per_s`) or says it has none (`_count`)."""
    return unit_suffix(key) is not None or key.endswith(PLAIN_SUFFIXES)


def machine() -> dict[str, Any]:
    """CPU count and model, memory, Python and OS: enough to compare two runs, nothing that names the host."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        memory = None
    return {"cpu_count": os.cpu_count(), "cpu_model": model or platform.processor() or None, "memory_bytes": memory,
            "python": platform.python_version(), "system": f"{platform.system()} {platform.machine()}"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked(figures: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """`figures` with NaN/inf as null; ValueError for a number (or list of numbers) under a key without a unit."""
    out: dict[str, Any] = {}
    for key, value in figures.items():
        where = f"{path}{key}"
        if isinstance(value, Mapping):
            out[key] = _checked(value, where + ".")
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(_is_number(v) for v in values) and not has_unit(str(key)):
            raise ValueError(f"bench figure {where!r}: its key names no unit (end it with _ms, _s, _bytes, _per_s, "
                             f"_pct, ..., or _count / _ratio for a plain number)")
        clean = [None if isinstance(v, float) and not math.isfinite(v) else v for v in values]
        out[key] = clean if isinstance(value, (list, tuple)) else clean[0]
    return out


def write_report(script: str, figures: Mapping[str, Any], *, out_dir: Path | None = None) -> Path:
    """Write `figures` of the benchmark `script` (its `__file__`) to `<out_dir>/<script name>.json` (atomically:
    a reader never sees half a file) and return the path."""
    name = Path(script).stem
    doc = {"name": name, "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
           "figures": _checked(figures)}
    directory = out_dir or OUT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path
