"""Fleet analytics: hourly rollups per GPU and the fleet summary built from them.

Time accounting is sample-and-hold: a sample stands for the time until the next one. A gap longer than
`max_gap_s` (the agent was away) counts only one typical interval, so an outage is not booked as busy or
idle time; the last sample of a series also counts one typical interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from server.analysis.energy import IDLE_UTIL_PCT, interval_energy
from server.analysis.jobdata import GpuSeries
from server.analysis.memory import used_peak_series

HOUR_S = 3600.0
ROLLUP_FIELDS = ("hour_start", "samples", "covered_s", "busy_s", "util_busy_s", "energy_j",
                 "memory_peak_bytes", "util_mean_pct")


def sample_durations(ts: np.ndarray, *, max_gap_s: float | None = None) -> np.ndarray:
    """Seconds each sample stands for (sample-and-hold), gaps capped at one typical interval."""
    ts = np.asarray(ts, dtype=np.float64)
    if ts.size == 0:
        return ts.copy()
    if ts.size == 1:
        return np.zeros(1)
    dt = np.diff(ts)
    typical = float(np.median(dt))
    cap = max_gap_s if max_gap_s is not None else 5.0 * typical
    dt = np.where(dt > cap, typical, dt)
    return np.concatenate([dt, [typical]])


def hourly_rollup(ts: np.ndarray, *, gpu_util_pct: np.ndarray | None = None,
                  memory_used_bytes: np.ndarray | None = None, power_w: np.ndarray | None = None,
                  energy_counter_j: np.ndarray | None = None, max_gap_s: float | None = None,
                  hour_s: float = HOUR_S) -> dict[str, np.ndarray]:
    """Rollup of one GPU's series into hour buckets (by the sample's own hour). Arrays aligned per hour.

    busy_s: time with utilization at or above IDLE_UTIL_PCT; util_busy_s: time × utilization (the
    kernel-busy time NVML measures). energy_j: counter deltas else integrated power, NaN where unknown.
    """
    ts = np.asarray(ts, dtype=np.float64)
    n = ts.size
    if n == 0:
        return {k: np.empty(0) for k in ROLLUP_FIELDS}
    nan = np.full(n, np.nan)
    util = nan if gpu_util_pct is None else np.asarray(gpu_util_pct, dtype=np.float64)
    mem = nan if memory_used_bytes is None else np.asarray(memory_used_bytes, dtype=np.float64)
    dur = sample_durations(ts, max_gap_s=max_gap_s)

    hour = np.floor(ts / hour_s)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(hour)) + 1])

    def rsum(x: np.ndarray) -> np.ndarray:
        return np.add.reduceat(x, starts)

    util_known = ~np.isnan(util)
    with np.errstate(invalid="ignore"):
        busy = (util >= IDLE_UTIL_PCT) & util_known
    u0 = np.where(util_known, util, 0.0)
    n_util = rsum(util_known.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        util_mean = np.where(n_util > 0, rsum(u0) / np.maximum(n_util, 1), np.nan)

    # Energy per interval, attributed to the hour of the interval's start sample.
    e = np.full(n, np.nan)
    if power_w is not None or energy_counter_j is not None:
        typical = float(np.median(np.diff(ts))) if n > 1 else 0.0
        iv = interval_energy(ts, nan if energy_counter_j is None else energy_counter_j,
                             nan if power_w is None else power_w,
                             max_power_gap_s=max_gap_s if max_gap_s is not None else 5.0 * typical)
        e[:-1] = iv.energy_j
    e_known = ~np.isnan(e)
    energy = np.where(rsum(e_known.astype(np.float64)) > 0, rsum(np.where(e_known, e, 0.0)), np.nan)

    mem_f = np.where(np.isnan(mem), -np.inf, mem)
    mem_peak = np.maximum.reduceat(mem_f, starts)
    mem_peak = np.where(np.isinf(mem_peak), np.nan, mem_peak)

    return {
        "hour_start": hour[starts] * hour_s,
        "samples": np.diff(np.concatenate([starts, [n]])).astype(np.float64),
        "covered_s": rsum(dur),
        "busy_s": np.where(n_util > 0, rsum(np.where(busy, dur, 0.0)), np.nan),
        "util_busy_s": np.where(n_util > 0, rsum(dur * u0 / 100.0), np.nan),
        "energy_j": energy,
        "memory_peak_bytes": mem_peak,
        "util_mean_pct": util_mean,
    }


def rollup_gpus(gpus: Iterable[GpuSeries], *, max_gap_s: float | None = None) -> dict[str, Any]:
    """Hourly rollups of several GPUs as one table: the ROLLUP_FIELDS arrays plus `gpu_uuid` (object)."""
    parts: list[dict[str, np.ndarray]] = []
    uuids: list[np.ndarray] = []
    for g in gpus:
        r = hourly_rollup(
            g.ts, gpu_util_pct=g.column("gpu_util_pct"), memory_used_bytes=used_peak_series(g),
            power_w=g.column("power_w"), energy_counter_j=g.column("energy_counter_j"), max_gap_s=max_gap_s)
        parts.append(r)
        uuids.append(np.full(r["hour_start"].size, g.uuid, dtype=object))
    out: dict[str, Any] = {k: (np.concatenate([p[k] for p in parts]) if parts else np.empty(0))
                           for k in ROLLUP_FIELDS}
    out["gpu_uuid"] = np.concatenate(uuids) if uuids else np.empty(0, dtype=object)
    return out


def job_fleet_row(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the fleet summary needs from one job's characterization report."""
    gpus = report.get("gpus") or []
    stranded = [g["memory_total_bytes"] - g["peak_used_bytes"] for g in gpus
                if g.get("memory_total_bytes") is not None and g.get("peak_used_bytes") is not None]
    busy = (report.get("time") or {}).get("gpu_busy_fraction")
    duration = report.get("duration_s")
    gpu_hours = len(gpus) * duration / HOUR_S if duration is not None else None
    return {
        "job_id": report.get("job_id"),
        "team": report.get("team"),
        "state": report.get("state"),
        "gpus": len(gpus),
        "gpu_hours": gpu_hours,
        "gpu_busy_fraction": busy,
        "wasted_gpu_hours": gpu_hours * (1.0 - busy) if (gpu_hours is not None and busy is not None) else None,
        "memory_stranded_bytes": sum(stranded) if stranded else None,
        "energy_j": (report.get("energy") or {}).get("energy_j"),
        "idle_energy_j": (report.get("energy") or {}).get("idle_energy_j"),
    }


def _nansum_or_none(a: np.ndarray) -> float | None:
    a = np.asarray(a, dtype=np.float64)
    return None if a.size == 0 or np.all(np.isnan(a)) else float(np.nansum(a))


def fleet_summary(rollups: Mapping[str, Any], *, now: float, window_s: float = 86_400.0,
                  current_util_pct: Mapping[str, float | None] | None = None,
                  jobs: Sequence[Mapping[str, Any]] = (), top_n: int = 10) -> dict[str, Any]:
    """Fleet efficiency over the hours starting in [now − window_s, now).

    `current_util_pct`: the latest utilization per GPU (None = unknown); a GPU below IDLE_UTIL_PCT is idle
    now. `jobs`: rows from `job_fleet_row` for the jobs in the window (memory stranded, most wasteful).
    """
    hour_start = np.asarray(rollups["hour_start"], dtype=np.float64)
    sel = (hour_start >= now - window_s) & (hour_start < now)

    def col(name: str) -> np.ndarray:
        return np.asarray(rollups[name], dtype=np.float64)[sel]

    covered, busy, util_busy = col("covered_s"), col("busy_s"), col("util_busy_s")
    uuids = np.asarray(rollups["gpu_uuid"], dtype=object)[sel]
    gpu_hours = float(np.sum(covered)) / HOUR_S
    busy_h = _nansum_or_none(busy)
    idle_now = unknown_now = None
    if current_util_pct is not None:
        vals = list(current_util_pct.values())
        idle_now = sum(1 for v in vals if v is not None and v < IDLE_UTIL_PCT)
        unknown_now = sum(1 for v in vals if v is None)
    stranded = [j["memory_stranded_bytes"] for j in jobs if j.get("memory_stranded_bytes") is not None]
    wasteful = sorted((j for j in jobs if j.get("wasted_gpu_hours") is not None),
                      key=lambda j: -j["wasted_gpu_hours"])[:top_n]
    return {
        "window_s": window_s,
        "gpus": int(np.unique(uuids.astype(str)).size) if uuids.size else 0,
        "gpu_hours": gpu_hours,
        "busy_gpu_hours": None if busy_h is None else busy_h / HOUR_S,
        "busy_fraction": (busy_h / HOUR_S / gpu_hours) if (busy_h is not None and gpu_hours > 0) else None,
        "util_weighted_gpu_hours": None if _nansum_or_none(util_busy) is None
        else _nansum_or_none(util_busy) / HOUR_S,  # type: ignore[operator]
        "idle_gpus_now": idle_now,
        "gpus_unknown_now": unknown_now,
        "energy_j": _nansum_or_none(col("energy_j")),
        "memory_stranded_bytes": sum(stranded) if stranded else None,
        "most_wasteful_jobs": [dict(j) for j in wasteful],
    }
