"""Health findings of a GPU over a recent window from SQL aggregates (the fleet's "GPUs needing attention"), not
from its samples: counts of samples per slowdown kind, the XIDs seen, each counter's rise (max - min over the window,
which a counter reset inside it understates) and the flags' maxima. Same kinds and thresholds as `findings`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetprof.report import HealthFinding
from server.analysis.health.findings import COUNTERS, FLAGS, MIN_SLOWDOWN_S, SEVERITY, SLOWDOWN_TITLES
from server.analysis.health.reasons import SLOWDOWN_KINDS, names

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _span(seconds: float) -> str:
    return f"{seconds / 60.0:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def window_findings(gpu_uuid: str, agg: Mapping[str, Any], *, window_s: float) -> list[HealthFinding]:
    """`agg`: samples (count), first_ts, last_ts, `<kind>_samples` per SLOWDOWN_KINDS, xid_min/xid_max, and per
    counter column `<column>_rise`, per flag column `<column>_max` (absent: the column is not stored)."""
    n = int(agg.get("samples") or 0)
    if n == 0:
        return []
    first, last = float(agg["first_ts"]), float(agg["last_ts"])
    interval = (last - first) / (n - 1) if n > 1 else 0.0
    out: list[HealthFinding] = []

    def add(kind: str, summary: str, **fields: Any) -> None:
        out.append(HealthFinding.model_validate({"gpu_uuid": gpu_uuid, "kind": kind, "summary": summary,
                                                 "severity": SEVERITY.get(kind, "info"), "seconds": None,
                                                 "fraction": None, **fields}))

    for kind, mask in SLOWDOWN_KINDS.items():
        count = int(agg.get(f"{kind}_samples") or 0)
        seconds = count * interval
        if count and seconds >= MIN_SLOWDOWN_S:
            add(kind, f"{SLOWDOWN_TITLES[kind]} for {_span(seconds)} of the last {_span(window_s)} ({count / n:.0%} "
                      f"of its samples)", seconds=seconds, fraction=count / n,
                source="nvml:clock event reasons " + "+".join(names(mask)) + " (SQL counts over the window)")
    xids = sorted({int(v) for v in (agg.get("xid_min"), agg.get("xid_max")) if v is not None})
    if xids:
        add("xid", f"XID {', '.join(map(str, xids))} reported (the latest XID the agent saw on this GPU)", xids=xids,
            count=len(xids), source="nvml:XID critical error events (xid_last)")
    seen: set[str] = set()
    for column, kind, what, source in COUNTERS:
        rise = agg.get(f"{column}_rise")
        if rise is None or rise <= 0 or (kind.startswith("ecc") and kind in seen):
            continue
        seen.add(kind)
        add(kind, f"{int(rise)} {what} in the last {_span(window_s)}", count=int(rise), source=f"{source} ({column})")
    for column, kind, what in FLAGS:
        if (agg.get(f"{column}_max") or 0) > 0:
            add(kind, what, source=f"nvml:{column}")
    out.sort(key=lambda f: SEVERITY_ORDER.get(f.severity or "info", 3))
    return out


def worst_severity(findings: list[HealthFinding]) -> str | None:
    return min((f.severity or "info" for f in findings), key=lambda s: SEVERITY_ORDER.get(s, 3), default=None)
