"""Fleet analytics: hourly rollups per GPU (and per job on a GPU), the figures of groups of rollup rows (a node, a
team), and the fleet summary built from them.

Time accounting is sample-and-hold: a sample stands for the time until the next one. A gap longer than
`max_gap_s` (the agent was away) counts only one typical interval, so an outage is not booked as busy or
idle time; the last sample of a series also counts one typical interval.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.analysis.base.durations import sample_durations
from server.analysis.base.jobdata import GpuSeries
from server.analysis.energy.accounting import IDLE_UTIL_PCT, interval_energy
from server.analysis.fleet.goodput import goodput_terms, idle_runs
from server.analysis.health.findings import near_slowdown, slowdown_temperature
from server.analysis.health.reasons import SLOWDOWN_KINDS, any_slowdown, as_bits, slowdown_masks
from server.analysis.memory.usage import used_peak_series

HOUR_S = 3600.0
# Goodput (issue #20, server.analysis.fleet.goodput says what each is): the util-known time of an hour split four ways.
GOODPUT_FIELDS = ("idle_s", "stalled_s", "throttled_s", "productive_s")
# Seconds under each slowdown kind (health.reasons.slowdown_masks), for the fleet's "GPUs needing attention".
SLOWDOWN_FIELDS = tuple(f"{kind}_s" for kind in SLOWDOWN_KINDS)
# Seconds within health.findings.TEMPERATURE_MARGIN_C of the GPU's slowdown temperature (null: unknown), for the
# same list.
NEAR_SLOWDOWN_FIELD = "near_slowdown_s"
ROLLUP_FIELDS = ("hour_start", "samples", "covered_s", "busy_s", "util_busy_s", "energy_j",
                 "memory_peak_bytes", "util_mean_pct", *GOODPUT_FIELDS, *SLOWDOWN_FIELDS, NEAR_SLOWDOWN_FIELD)
ENERGY_SOURCE = "energy_source"  # per hour: where its energy came from (an object column beside the fields)


@dataclass
class SampleTerms:
    """Per-sample quantities of one GPU's series that every hourly figure is a (weighted) sum of."""

    hour: np.ndarray  # hour index of each sample: floor(ts / hour_s)
    hour_s: float
    dur: np.ndarray  # seconds the sample stands for (sample_durations)
    util: np.ndarray  # NaN = unknown
    mem: np.ndarray  # NaN = unknown
    energy_j: np.ndarray  # energy of the interval the sample starts; NaN = unknown (and for the last sample)
    from_counter: np.ndarray  # bool: that interval's energy is a counter delta
    from_power: np.ndarray  # bool: ... integrated power
    throttled: np.ndarray | None = None  # bool: a slowdown clock-event reason was set (health.reasons)
    idle_run: np.ndarray | None = None  # bool: part of a run of low-utilization samples lasting IDLE_RUN_S or more
    reasons_known: np.ndarray | None = None  # bool: the sample has a clock-event reasons reading
    slowdowns: dict[str, np.ndarray] | None = None  # kind -> bool per sample (health.reasons.slowdown_masks)
    near_slowdown: np.ndarray | None = None  # bool: temperature near the slowdown threshold (None: threshold unknown)
    temperature_known: np.ndarray | None = None  # bool: the sample has a temperature reading


def sample_terms(ts: np.ndarray, *, gpu_util_pct: np.ndarray | None = None,
                 memory_used_bytes: np.ndarray | None = None, power_w: np.ndarray | None = None,
                 energy_counter_j: np.ndarray | None = None, max_gap_s: float | None = None,
                 hour_s: float = HOUR_S, throttle_reasons: np.ndarray | None = None,
                 temperature_c: np.ndarray | None = None, slowdown_temperature_c: float | None = None) -> SampleTerms:
    ts = np.asarray(ts, dtype=np.float64)
    n = ts.size
    nan = np.full(n, np.nan)
    e = np.full(n, np.nan)
    from_counter = np.zeros(n, dtype=bool)
    from_power = np.zeros(n, dtype=bool)
    if n > 1 and (power_w is not None or energy_counter_j is not None):
        typical = float(np.median(np.diff(ts)))
        iv = interval_energy(ts, nan if energy_counter_j is None else energy_counter_j,
                             nan if power_w is None else power_w,
                             max_power_gap_s=max_gap_s if max_gap_s is not None else 5.0 * typical)
        # Energy per interval, attributed to the interval's start sample (and so to its hour).
        e[:-1] = iv.energy_j
        from_counter[:-1] = iv.from_counter
        from_power[:-1] = iv.from_power
    dur = sample_durations(ts, max_gap_s=max_gap_s)
    util = nan if gpu_util_pct is None else np.asarray(gpu_util_pct, dtype=np.float64)
    return SampleTerms(
        hour=np.floor(ts / hour_s), hour_s=hour_s, dur=dur, util=util,
        mem=nan if memory_used_bytes is None else np.asarray(memory_used_bytes, dtype=np.float64),
        energy_j=e, from_counter=from_counter, from_power=from_power,
        throttled=np.zeros(n, dtype=bool) if throttle_reasons is None else any_slowdown(throttle_reasons),
        idle_run=idle_runs(util, dur),
        reasons_known=np.zeros(n, dtype=bool) if throttle_reasons is None else as_bits(throttle_reasons)[1],
        slowdowns=None if throttle_reasons is None else slowdown_masks(throttle_reasons),
        near_slowdown=None if temperature_c is None or slowdown_temperature_c is None
        else near_slowdown(temperature_c, slowdown_temperature_c),
        temperature_known=None if temperature_c is None else ~np.isnan(np.asarray(temperature_c, dtype=np.float64)))


def reduce_hours(t: SampleTerms, weight: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The ROLLUP_FIELDS per hour (plus `energy_source`) of the samples with a positive `weight`, each sample
    counting `weight` of itself (1 when None): the one definition of every hourly figure.

    busy_s: time with utilization at or above IDLE_UTIL_PCT; util_busy_s: time × utilization (the
    kernel-busy time NVML measures); util_mean_pct: the sample mean. energy_j: counter deltas else
    integrated power, NaN where unknown; energy_source: "hardware_counter", "integrated_power", "mixed" or None.
    memory_peak_bytes: the largest sample (a fraction of a sample is still that sample's memory).
    """
    n = t.hour.size
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64)
    idx = np.flatnonzero(w > 0)
    if idx.size == 0:
        out = {k: np.empty(0) for k in ROLLUP_FIELDS}
        out[ENERGY_SOURCE] = np.empty(0, dtype=object)
        return out
    w = w[idx]
    hour = t.hour[idx]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(hour)) + 1])

    def rsum(x: np.ndarray) -> np.ndarray:
        return np.add.reduceat(x, starts)

    def rany(x: np.ndarray) -> np.ndarray:
        return np.maximum.reduceat(x.astype(np.int8), starts) > 0

    util, dur = t.util[idx], t.dur[idx]
    util_known = ~np.isnan(util)
    with np.errstate(invalid="ignore"):
        busy = (util >= IDLE_UTIL_PCT) & util_known
    u0 = np.where(util_known, util, 0.0)
    n_util = rsum(w * util_known)
    has_util = n_util > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        util_mean = np.where(has_util, rsum(w * u0) / np.where(has_util, n_util, 1.0), np.nan)

    e = t.energy_j[idx]
    e_known = ~np.isnan(e)
    energy = np.where(rsum(w * e_known) > 0, rsum(np.where(e_known, w * e, 0.0)), np.nan)
    counter, power = rany(t.from_counter[idx]), rany(t.from_power[idx])
    source = np.array([("mixed" if p else "hardware_counter") if c else ("integrated_power" if p else None)
                       for c, p in zip(counter, power, strict=True)], dtype=object)

    mem = t.mem[idx]
    mem_peak = np.maximum.reduceat(np.where(np.isnan(mem), -np.inf, mem), starts)
    mem_peak = np.where(np.isinf(mem_peak), np.nan, mem_peak)

    goodput = goodput_terms(util, dur, None if t.throttled is None else t.throttled[idx],
                            None if t.idle_run is None else t.idle_run[idx])
    has_reasons = rsum(w * t.reasons_known[idx]) > 0 if t.reasons_known is not None else np.zeros(starts.size, bool)
    slow = {f"{kind}_s": np.where(has_reasons, rsum(w * dur * t.slowdowns[kind][idx]), np.nan)
            if t.slowdowns is not None else np.full(starts.size, np.nan) for kind in SLOWDOWN_KINDS}
    if t.near_slowdown is not None and t.temperature_known is not None:
        has_temp = rsum(w * t.temperature_known[idx]) > 0
        near = np.where(has_temp, rsum(w * dur * t.near_slowdown[idx]), np.nan)
    else:
        near = np.full(starts.size, np.nan)
    return {
        **slow,
        NEAR_SLOWDOWN_FIELD: near,
        **{k: np.where(has_util, rsum(w * v), np.nan) for k, v in goodput.items()},
        "hour_start": hour[starts] * t.hour_s,
        "samples": rsum(w),
        "covered_s": rsum(w * dur),
        "busy_s": np.where(has_util, rsum(np.where(busy, w * dur, 0.0)), np.nan),
        "util_busy_s": np.where(has_util, rsum(w * dur * u0 / 100.0), np.nan),
        "energy_j": energy,
        "memory_peak_bytes": mem_peak,
        "util_mean_pct": util_mean,
        ENERGY_SOURCE: source,
    }


def hourly_rollup(ts: np.ndarray, *, gpu_util_pct: np.ndarray | None = None,
                  memory_used_bytes: np.ndarray | None = None, power_w: np.ndarray | None = None,
                  energy_counter_j: np.ndarray | None = None, max_gap_s: float | None = None,
                  hour_s: float = HOUR_S, throttle_reasons: np.ndarray | None = None,
                  temperature_c: np.ndarray | None = None,
                  slowdown_temperature_c: float | None = None) -> dict[str, np.ndarray]:
    """Rollup of one GPU's series into hour buckets (by the sample's own hour). Arrays aligned per hour;
    see reduce_hours for the fields."""
    return reduce_hours(sample_terms(ts, gpu_util_pct=gpu_util_pct, memory_used_bytes=memory_used_bytes,
                                     power_w=power_w, energy_counter_j=energy_counter_j, max_gap_s=max_gap_s,
                                     hour_s=hour_s, throttle_reasons=throttle_reasons, temperature_c=temperature_c,
                                     slowdown_temperature_c=slowdown_temperature_c))


def attribution_weights(ts: np.ndarray, windows: Sequence[tuple[Hashable, float, float]]
                        ) -> tuple[list[Hashable | None], np.ndarray]:
    """Which job each sample of one GPU belongs to, from the job↔GPU windows (key, start, end), both ends
    included (as a job's report loads its samples).

    Returns (keys, weights): weights[k] is the share of each sample that goes to keys[k]; the last key is None,
    the time of no job. A sample inside m jobs' windows (jobs sharing a GPU) counts 1/m to each, so the shares
    of every sample add up to 1 and attributed time never exceeds the GPU's own.
    """
    ts = np.asarray(ts, dtype=np.float64)
    masks: dict[Hashable, np.ndarray] = {}
    for key, start, end in windows:
        inside = (ts >= start) & (ts <= end)
        masks[key] = masks[key] | inside if key in masks else inside
    keys: list[Hashable | None] = list(masks)
    count = np.sum([m for m in masks.values()], axis=0) if masks else np.zeros(ts.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = [np.where(m, 1.0 / np.maximum(count, 1), 0.0) for m in masks.values()]
    keys.append(None)
    shares.append((count == 0).astype(np.float64))
    return keys, np.array(shares).reshape(len(keys), ts.size)


def attributed_rollup(terms: SampleTerms, keys: Sequence[Hashable | None], weights: np.ndarray) -> dict[str, Any]:
    """reduce_hours once per key (attribution_weights), as one table with a `key` column (object): a key's
    rows are the hours it has samples in."""
    parts = [(k, reduce_hours(terms, w)) for k, w in zip(keys, weights, strict=True)]
    out: dict[str, Any] = {f: np.concatenate([p[f] for _, p in parts]) if parts else np.empty(0)
                           for f in (*ROLLUP_FIELDS, ENERGY_SOURCE)}
    out["key"] = np.array([k for k, p in parts for _ in range(p["hour_start"].size)], dtype=object)
    return out


def rollup_gpus(gpus: Iterable[GpuSeries], *, max_gap_s: float | None = None) -> dict[str, Any]:
    """Hourly rollups of several GPUs as one table: the ROLLUP_FIELDS arrays plus `energy_source` and
    `gpu_uuid` (object)."""
    parts: list[dict[str, np.ndarray]] = []
    uuids: list[np.ndarray] = []
    for g in gpus:
        r = hourly_rollup(
            g.ts, gpu_util_pct=g.column("gpu_util_pct"), memory_used_bytes=used_peak_series(g),
            power_w=g.column("power_w"), energy_counter_j=g.column("energy_counter_j"), max_gap_s=max_gap_s,
            throttle_reasons=g.column("throttle_reasons"), temperature_c=g.column("temperature_c"),
            slowdown_temperature_c=slowdown_temperature(g).value)
        parts.append(r)
        uuids.append(np.full(r["hour_start"].size, g.uuid, dtype=object))
    out: dict[str, Any] = {k: (np.concatenate([p[k] for p in parts]) if parts else np.empty(0))
                           for k in (*ROLLUP_FIELDS, ENERGY_SOURCE)}
    out["gpu_uuid"] = np.concatenate(uuids) if uuids else np.empty(0, dtype=object)
    return out


def job_fleet_row(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the fleet views (summary, headroom) need from one job's characterization report: stored beside the
    report (`reports.fleet_row`) so that they never read the whole document."""
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
        # the job's largest single-GPU NVML peak against that GPU's capacity (the headroom view)
        **{key: (report.get("memory") or {}).get(key)
           for key in ("peak_used_bytes", "memory_total_bytes", "headroom_bytes")},
    }


# Where a group's energy came from, as GPU-hours per source: "unknown" = no energy for that time, "unrecorded" =
# energy from rollups written before the source was recorded.
ENERGY_SOURCES = ("hardware_counter", "integrated_power", "mixed", "unknown", "unrecorded")


def group_figures(*, covered_s: float, busy_s: float | None, util_busy_s: float | None, energy_j: float | None,
                  memory_peak_bytes: float | None, util_mean_weighted: float | None, util_covered_s: float | None,
                  energy_source_s: Mapping[str, float | None]) -> dict[str, Any]:
    """The figures of a group of hourly rollup rows (the GPUs of a node in an hour, a team's shares of GPUs in
    an hour...) from the sums over its rows: covered_s, busy_s, util_busy_s and energy_j summed over the rows
    that know them (None when none does), memory_peak_bytes the largest row's, util_mean_weighted = Σ
    util_mean_pct × covered_s and util_covered_s = Σ covered_s over the rows with a mean utilization,
    energy_source_s = covered_s per ENERGY_SOURCES entry.

    Mean utilization is time-weighted over the group's rows (within a row it is the sample mean), so a GPU
    seen for a minute does not weigh as much as one seen all hour.
    """
    gpu_hours = covered_s / HOUR_S
    return {
        "gpu_hours": gpu_hours,
        "busy_gpu_hours": None if busy_s is None else busy_s / HOUR_S,
        "busy_fraction": busy_s / covered_s if (busy_s is not None and covered_s > 0) else None,
        "util_weighted_gpu_hours": None if util_busy_s is None else util_busy_s / HOUR_S,
        "util_mean_pct": util_mean_weighted / util_covered_s
        if (util_mean_weighted is not None and util_covered_s) else None,
        "energy_j": energy_j,
        "energy_source_gpu_hours": {k: (energy_source_s.get(k) or 0.0) / HOUR_S for k in ENERGY_SOURCES},
        "memory_used_max_bytes": None if memory_peak_bytes is None else int(memory_peak_bytes),
    }


def _nansum_or_none(a: np.ndarray) -> float | None:
    a = np.asarray(a, dtype=np.float64)
    return None if a.size == 0 or np.all(np.isnan(a)) else float(np.nansum(a))


def rollup_totals(rollups: Mapping[str, Any], *, now: float, window_s: float = 86_400.0) -> dict[str, Any]:
    """What fleet_summary needs of the hourly rollups starting in [now − window_s, now): distinct GPUs and the
    sums of covered_s, busy_s, util_busy_s and energy_j (None where no row knows them, as SQL's SUM)."""
    hour_start = np.asarray(rollups["hour_start"], dtype=np.float64)
    sel = (hour_start >= now - window_s) & (hour_start < now)

    def col(name: str) -> np.ndarray:
        return np.asarray(rollups[name], dtype=np.float64)[sel]

    uuids = np.asarray(rollups["gpu_uuid"], dtype=object)[sel]
    return {
        "gpus": int(np.unique(uuids.astype(str)).size) if uuids.size else 0,
        "covered_s": float(np.sum(col("covered_s"))),
        **{k: _nansum_or_none(col(k)) for k in ("busy_s", "util_busy_s", "energy_j")},
    }


def fleet_summary(rollups: Mapping[str, Any], *, now: float, window_s: float = 86_400.0,
                  current_util_pct: Mapping[str, float | None] | None = None,
                  jobs: Sequence[Mapping[str, Any]] = (), top_n: int = 10) -> dict[str, Any]:
    """Fleet efficiency over the hours starting in [now − window_s, now).

    `current_util_pct`: the latest utilization per GPU (None = unknown); a GPU below IDLE_UTIL_PCT is idle
    now. `jobs`: rows from `job_fleet_row` for the jobs in the window (memory stranded, most wasteful).
    """
    return summary_from_totals(rollup_totals(rollups, now=now, window_s=window_s), window_s=window_s,
                               gpus_now=None if current_util_pct is None else gpus_now(current_util_pct),
                               jobs=job_figures(jobs, top_n=top_n))


def gpus_now(current_util_pct: Mapping[str, float | None]) -> dict[str, int]:
    """GPUs idle now (latest utilization below IDLE_UTIL_PCT) and GPUs whose latest utilization is unknown (None:
    e.g. MIG, where NVML has none), from the latest utilization per GPU."""
    vals = list(current_util_pct.values())
    return {"idle_gpus_now": sum(1 for v in vals if v is not None and v < IDLE_UTIL_PCT),
            "gpus_unknown_now": sum(1 for v in vals if v is None)}


def job_figures(jobs: Sequence[Mapping[str, Any]], *, top_n: int = 10) -> dict[str, Any]:
    """The summary's figures of the window's jobs (`job_fleet_row` rows): memory stranded (held by jobs, never
    used: Σ capacity − NVML peak; None when no job knows it) and the `top_n` jobs by wasted GPU-hours."""
    stranded = [j["memory_stranded_bytes"] for j in jobs if j.get("memory_stranded_bytes") is not None]
    wasteful = sorted((j for j in jobs if j.get("wasted_gpu_hours") is not None),
                      key=lambda j: -j["wasted_gpu_hours"])[:top_n]
    return {"memory_stranded_bytes": sum(stranded) if stranded else None,
            "most_wasteful_jobs": [dict(j) for j in wasteful]}


def summary_from_totals(totals: Mapping[str, Any], *, window_s: float, gpus_now: Mapping[str, int] | None,
                        jobs: Mapping[str, Any]) -> dict[str, Any]:
    """fleet_summary from `rollup_totals`, `gpus_now` (None: not known) and `job_figures`, or the same figures
    computed by the database."""
    gpu_hours = totals["covered_s"] / HOUR_S
    busy_s, util_busy_s = totals["busy_s"], totals["util_busy_s"]
    return {
        "window_s": window_s,
        "gpus": totals["gpus"],
        "gpu_hours": gpu_hours,
        "busy_gpu_hours": None if busy_s is None else busy_s / HOUR_S,
        "busy_fraction": (busy_s / HOUR_S / gpu_hours) if (busy_s is not None and gpu_hours > 0) else None,
        "util_weighted_gpu_hours": None if util_busy_s is None else util_busy_s / HOUR_S,
        "idle_gpus_now": None if gpus_now is None else gpus_now["idle_gpus_now"],
        "gpus_unknown_now": None if gpus_now is None else gpus_now["gpus_unknown_now"],
        "energy_j": totals["energy_j"],
        "memory_stranded_bytes": jobs["memory_stranded_bytes"],
        "most_wasteful_jobs": jobs["most_wasteful_jobs"],
    }
