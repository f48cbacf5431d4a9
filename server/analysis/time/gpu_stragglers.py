"""Stragglers from NVML alone: which of a job's GPUs holds the others back, when, by how much, and the likely cause.

A synchronous data-parallel job runs the same iteration on every GPU and waits for the slowest before the next:
the GPU whose compute phase is longer stays busy while its peers finish early and wait. So, per window of a few
iterations (the iteration period comes from telemetry, `iterations.telemetry_period`), each GPU's *busy phase per
iteration* is its kernel-busy time (Σ sample time × utilization.gpu / 100) over the window's iterations; a GPU whose
busy phase exceeds the median of its peers' by more than `TOL` in at least `MIN_WINDOWS` windows is a straggler.

The likely cause is read from the same windows: a slowdown reason held for a good share of them (thermal, power
cap, hardware), else an SM clock below the peers' (clocks set lower, no reason given), else unknown (the same
clocks: more work on that GPU's rank, or its input).

Waiting inside a collective that spins (NCCL) counts as busy in utilization.gpu, so a job whose peers wait in NCCL
shows no difference in busy time. Then, where every GPU is busy (≥ 90 %), a GPU whose SM clock stays under 90 % of
its peers' holds them back: it is named with `slowdown_fraction` = peers' clock / its clock - 1, an estimate that
holds for a compute-bound step (its `source` says so). A slower GPU at full clocks is then invisible to NVML; the
hooks' per-rank step times still see it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetprof.report import Straggler
from server.analysis.base.durations import sample_durations
from server.analysis.base.jobdata import GpuSeries
from server.analysis.health import reasons
from server.analysis.time import iterations

TOL = 0.10  # a busy phase 10 % longer than the peers' median
MIN_WINDOWS = 2
WINDOW_PERIODS = 5  # a window holds this many iterations...
MIN_WINDOW_S = 30.0  # ...and lasts at least this long (1 Hz sampling: 30 samples)
ACTIVE_BUSY_FRACTION = 0.1  # windows where the peers' median busy share is below this are idle, not judged
CAUSE_SHARE = 0.25  # a slowdown reason held this share of the straggling time is named as the cause
CLOCK_GAP = 0.95  # an SM clock below this share of the peers' is named as the cause
SATURATED_BUSY = 0.9  # every GPU this busy: utilization cannot tell who waits
CLOCK_GAP_STRAGGLER = 0.9  # ...then an SM clock under this share of the peers' marks the straggler
SOURCE_BUSY = "nvml:busy phase per iteration (gpu_util_pct x time), clocks, power, clock event reasons"
SOURCE_CLOCK = ("nvml:SM clock against its peers' while all were busy (utilization could not tell who waited); "
                "slowdown_fraction = peers' clock / its clock - 1, a compute-bound estimate")


@dataclass(frozen=True)
class _Window:
    busy: np.ndarray  # [gpu, window] busy share (0..1), NaN where the GPU's samples cover under half the window
    clock: np.ndarray  # [gpu, window] mean SM clock of its busy samples (utilization >= 50 %), NaN: none
    t0: float
    width_s: float


def _windows(gpus: Sequence[GpuSeries], period_s: float | None) -> _Window | None:
    width = max(MIN_WINDOW_S, WINDOW_PERIODS * period_s) if period_s else MIN_WINDOW_S
    t0 = min(float(g.ts[0]) for g in gpus)
    t1 = max(float(g.ts[-1]) for g in gpus)
    n = int((t1 - t0) // width) + 1
    if n < MIN_WINDOWS:
        return None
    busy = np.full((len(gpus), n), np.nan)
    clocks = np.full((len(gpus), n), np.nan)
    for i, g in enumerate(gpus):
        util = g.column("gpu_util_pct")
        dur = sample_durations(g.ts)
        ok = ~np.isnan(util)
        b = ((g.ts - t0) // width).astype(np.int64)
        covered = np.bincount(b[ok], weights=dur[ok], minlength=n)[:n]
        kernel = np.bincount(b[ok], weights=(dur * util / 100.0)[ok], minlength=n)[:n]
        sm = g.column("sm_clock_mhz")
        with np.errstate(invalid="ignore", divide="ignore"):
            busy[i] = np.where(covered >= 0.5 * width, kernel / covered, np.nan)
            hot = ok & ~np.isnan(sm) & (util >= 50.0)
            n_hot = np.bincount(b[hot], minlength=n)[:n]
            clocks[i] = np.where(n_hot > 0, np.bincount(b[hot], weights=sm[hot], minlength=n)[:n] / n_hot, np.nan)
    return _Window(busy=busy, clock=clocks, t0=t0, width_s=width)


def _in_windows(g: GpuSeries, w: _Window, windows: np.ndarray) -> np.ndarray:
    b = ((g.ts - w.t0) // w.width_s).astype(np.int64)
    return np.isin(b, windows)


def _mean_in(g: GpuSeries, name: str, mask: np.ndarray) -> float | None:
    v = g.column(name)[mask]
    v = v[~np.isnan(v)]
    return float(np.mean(v)) if v.size else None


def _cause(g: GpuSeries, peers: Sequence[GpuSeries], w: _Window, windows: np.ndarray) -> dict[str, object]:
    mine = _in_windows(g, w, windows)
    dur = sample_durations(g.ts)
    total = float(np.sum(dur[mine])) or 1.0
    shares = {kind: float(np.sum(dur[mine & m])) / total
              for kind, m in reasons.slowdown_masks(g.column("throttle_reasons")).items()}
    clock = _mean_in(g, "sm_clock_mhz", mine)
    peer_clocks = [c for c in (_mean_in(p, "sm_clock_mhz", _in_windows(p, w, windows)) for p in peers) if c is not None]
    peer_clock = float(np.median(peer_clocks)) if peer_clocks else None
    power = _mean_in(g, "power_w", mine)
    peer_powers = [x for x in (_mean_in(p, "power_w", _in_windows(p, w, windows)) for p in peers) if x is not None]
    kind, share = max(shares.items(), key=lambda kv: kv[1])
    if share >= CAUSE_SHARE:
        cause = {"thermal": "thermal throttling", "power_cap": "power-cap throttling",
                 "hw_slowdown": "hardware slowdown"}[kind]
    elif clock is not None and peer_clock and clock < CLOCK_GAP * peer_clock:
        cause = "lower SM clock than its peers (no NVML slowdown reason)"
    else:
        cause = "unknown: same clocks and no slowdown reason (more work or a slower input on this GPU)"
    return {"likely_cause": cause, "throttled_fraction": share if share > 0 else 0.0,
            "sm_clock_mean_mhz": clock, "peer_sm_clock_mean_mhz": peer_clock, "power_mean_w": power,
            "peer_power_mean_w": float(np.median(peer_powers)) if peer_powers else None}


def _span_period(peers: Sequence[GpuSeries], since: float, until: float) -> float | None:
    """The iteration period while it straggled, from its peers' signals over that span (the job's period over the
    whole run mixes the slowed stretch with the rest); None when no signal is periodic there."""
    best: iterations.PeriodResult | None = None
    for p in peers:
        inside = (p.ts >= since) & (p.ts <= until)
        for name in ("power_w", "gpu_util_pct"):
            res = iterations.detect_period(p.ts[inside], p.column(name)[inside], signal=name)
            if res is not None and (best is None or res.confidence > best.confidence):
                best = res
    return best.period_s if best is not None else None


def nvml_stragglers(gpus: Sequence[GpuSeries], period_s: float | None) -> list[Straggler]:
    """The job's straggling GPUs from utilization, clocks, power and clock-event reasons (no hooks needed)."""
    with_util = [g for g in gpus if g.ts.size and g.has("gpu_util_pct")]
    if len(with_util) < 2:
        return []
    w = _windows(with_util, period_s)
    if w is None:
        return []
    out = []
    for i, g in enumerate(with_util):
        others = np.delete(w.busy, i, axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a window no peer covers: NaN, not judged
            peer = np.nanmedian(others, axis=0)
        mine = w.busy[i]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = mine / peer
            slow = (peer >= ACTIVE_BUSY_FRACTION) & (ratio > 1.0 + TOL)
        windows = np.flatnonzero(slow)
        source = SOURCE_BUSY
        if windows.size < MIN_WINDOWS:
            # Utilization cannot tell when the peers stay busy while they wait (a spinning NCCL collective): then
            # a GPU whose SM clock is well below its peers' while all are busy holds them back, by the clock
            # ratio if the step is compute-bound (an estimate, and said so).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                peer_clock = np.nanmedian(np.delete(w.clock, i, axis=0), axis=0)
                saturated = (mine >= SATURATED_BUSY) & (peer >= SATURATED_BUSY)
                ratio = peer_clock / w.clock[i]
                windows = np.flatnonzero(saturated & (ratio > 1.0 / CLOCK_GAP_STRAGGLER))
            if windows.size < MIN_WINDOWS:
                continue
            source = SOURCE_CLOCK
        peers = [p for j, p in enumerate(with_util) if j != i]
        since = w.t0 + float(windows[0]) * w.width_s
        until = min(w.t0 + float(windows[-1] + 1) * w.width_s, float(g.ts[-1]))
        # the period while it straggled: over its longest run of consecutive straggling windows (a span that
        # spans a recovered stretch would mix two periods)
        runs = np.split(windows, np.flatnonzero(np.diff(windows) > 1) + 1)
        longest = max(runs, key=len)
        step_s = _span_period(peers, w.t0 + float(longest[0]) * w.width_s,
                              w.t0 + float(longest[-1] + 1) * w.width_s) or period_s
        by_busy = source == SOURCE_BUSY  # busy phases mean nothing when every GPU looked busy
        phase = float(np.median(mine[windows])) * step_s if step_s and by_busy else None
        peer_phase = float(np.median(peer[windows])) * step_s if step_s and by_busy else None
        cause = _cause(g, peers, w, windows)
        out.append(Straggler.model_validate({
            "rank": None, "gpu_uuid": g.uuid, "median_step_s": step_s,
            "slowdown_fraction": float(np.median(ratio[windows])) - 1.0,
            "busy_phase_s": phase, "peer_busy_phase_s": peer_phase,
            "since_ts": since, "until_ts": until, "seconds": float(windows.size) * w.width_s,
            "window_s": w.width_s, "source": source, **cause}))
    return out
