"""Health findings of a GPU over a recent window from what the database sums cheaply (the fleet's "GPUs needing
attention"), not from its samples: seconds per slowdown kind from the hourly rollups, and the first and last sample of
the window for XIDs (a change of `xid_last`), counters (last - first: a reset inside the window understates the
rise) and flags (the last value). Same kinds, thresholds and severities as `findings`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetprof.report import HealthFinding, sample_source_suffix
from server.analysis.health.findings import (
    COUNTERS,
    FLAGS,
    MIN_SLOWDOWN_S,
    SEVERITY,
    SLOWDOWN_TITLES,
    TEMPERATURE_MARGIN_C,
)
from server.analysis.health.reasons import SLOWDOWN_KINDS, names

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _span(seconds: float) -> str:
    return f"{seconds / 60.0:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def window_findings(gpu_uuid: str, agg: Mapping[str, Any], *, window_s: float,
                    sample_source: str | None = None) -> list[HealthFinding]:
    """`agg` (any key may be absent or None: unknown): covered_s, `<kind>_s` per SLOWDOWN_KINDS and near_slowdown_s
    from the rollups; `<column>_first` / `<column>_last` of the window's first and last sample reading the column
    (xid_last, the COUNTERS and the FLAGS columns the table has). `sample_source`: the node's batch source, to label the
    findings of the NVML test double or a replay."""
    out: list[HealthFinding] = []
    suffix = sample_source_suffix(sample_source)

    def add(kind: str, summary: str, **fields: Any) -> None:
        fields["source"] = fields["source"] + suffix
        out.append(HealthFinding.model_validate({"gpu_uuid": gpu_uuid, "kind": kind, "summary": summary,
                                                 "severity": SEVERITY.get(kind, "info"), "seconds": None,
                                                 "fraction": None, **fields}))

    covered = agg.get("covered_s") or 0.0
    # seconds the rollups counted: under each slowdown clock-event reason, and near the slowdown temperature
    timed = [(kind, f"{kind}_s", SLOWDOWN_TITLES[kind],
              "nvml:clock event reasons " + "+".join(names(mask)) + " (hourly rollups)")
             for kind, mask in SLOWDOWN_KINDS.items()]
    timed.append(("temperature_near_slowdown", "near_slowdown_s",
                  f"temperature within {TEMPERATURE_MARGIN_C:.0f} °C of its slowdown threshold",
                  "nvml:temperature_c vs slowdown threshold (hourly rollups)"))
    for kind, key, title, source in timed:
        seconds = agg.get(key)
        if seconds is not None and seconds >= MIN_SLOWDOWN_S:
            fraction = seconds / covered if covered > 0 else None
            share = f" ({fraction:.0%} of its time)" if fraction is not None else ""
            add(kind, f"{title} for {_span(seconds)} in the rollup hours of the last {_span(window_s)}{share}",
                seconds=seconds, fraction=fraction, source=source)
    first, last = agg.get("xid_last_first"), agg.get("xid_last_last")
    if last is not None and last != first:
        add("xid", f"XID {int(last)} in the last {_span(window_s)}", xids=[int(last)], count=1,
            source="nvml:XID critical error events (xid_last changed in the window)")
    seen: set[str] = set()
    for column, kind, what, source in COUNTERS:
        a, b = agg.get(f"{column}_first"), agg.get(f"{column}_last")
        if a is None or b is None or b <= a or (kind.startswith("ecc") and kind in seen):
            continue
        seen.add(kind)
        add(kind, f"{int(b - a)} {what} in the last {_span(window_s)}", count=int(b - a),
            source=f"{source} ({column})")
    for column, kind, what in FLAGS:
        if (agg.get(f"{column}_last") or 0) > 0:
            add(kind, what, source=f"nvml:{column}")
    out.sort(key=lambda f: SEVERITY_ORDER.get(f.severity or "info", 3))
    return out


def worst_severity(findings: list[HealthFinding]) -> str | None:
    return min((f.severity or "info" for f in findings), key=lambda s: SEVERITY_ORDER.get(s, 3), default=None)
