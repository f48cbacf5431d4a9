"""Iteration period from telemetry alone, input stalls, stragglers.

Training is periodic: every iteration runs the same kernels, so power, utilization and (less often, the
caching allocator flattens it) memory repeat with the iteration period. We find the period in two passes:

1. autocorrelation (FFT) of the detrended, uniformly resampled signal gives a coarse period in whole
   samples and picks the fundamental rather than a harmonic (the first peak nearly as high as the best);
2. the phase of the signal band-passed around 1/coarse advances 2π per iteration: its mean slope gives
   the mean period to a fraction of a sample (at 1 Hz a 4-s iteration is otherwise only known to ±12%),
   and stays the mean when the iteration time drifts over the window.

The detectable range is [2 samples (Nyquist), a third of the analysed window]: shorter iterations alias
and are better taken from the hooks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetprof.report import InputStalls, Straggler, Stragglers
from server.analysis.base.jobdata import GpuSeries, StepSeries

# An autocorrelation peak below this is noise, not a period.
MIN_ACF_PEAK = 0.2
# The fundamental is the first peak at least this high relative to the highest (later peaks are harmonics).
FUNDAMENTAL_RATIO = 0.65
# Analyse at most this many samples (4 h at 1 Hz): periods are local, and it bounds the cost on long jobs.
MAX_WINDOW_SAMPLES = 14_400
# Telemetry and hooks agree when within this relative difference.
AGREEMENT_TOL = 0.05
# Band-pass around the coarse frequency f0 for the phase refinement, [f0 / BAND_LOW, f0 × BAND]: wide on
# the slow side (iterations up to 1.9× the typical still count as one), narrow on the fast side to keep
# the 2nd harmonic (2·f0, strong for a square-ish load) out.
BAND = 1.4
BAND_LOW = 1.9


@dataclass
class PeriodResult:
    period_s: float
    confidence: float  # autocorrelation at the coarse period, 0..1
    signal: str | None = None


def _uniform(ts: np.ndarray, values: np.ndarray) -> tuple[float, np.ndarray] | None:
    """Resample onto a grid at the median sampling interval (linear interpolation over NaNs and jitter)."""
    ok = ~np.isnan(values) & ~np.isnan(ts)
    ts, values = ts[ok], values[ok]
    if ts.size < 8:
        return None
    dt = float(np.median(np.diff(ts)))
    if dt <= 0:
        return None
    n = int((ts[-1] - ts[0]) / dt) + 1
    if n > MAX_WINDOW_SAMPLES:
        # The middle of the job: steady state, away from start-up and shutdown.
        mid = 0.5 * (ts[0] + ts[-1])
        t0 = mid - 0.5 * MAX_WINDOW_SAMPLES * dt
        n = MAX_WINDOW_SAMPLES
    else:
        t0 = ts[0]
    grid = t0 + dt * np.arange(n)
    return dt, np.interp(grid, ts, values)


def _detrend(y: np.ndarray, width: int) -> np.ndarray:
    """Subtract a centred moving average (cumsum, O(n)): removes drifts slower than `width` samples."""
    width = max(3, min(width, y.size))
    c = np.cumsum(np.concatenate([[0.0], y]))
    half = width // 2
    lo = np.clip(np.arange(y.size) - half, 0, y.size)
    hi = np.clip(np.arange(y.size) + half + 1, 0, y.size)
    return y - (c[hi] - c[lo]) / (hi - lo)


def _acf(y: np.ndarray, max_lag: int) -> np.ndarray:
    n = y.size
    nfft = 1 << int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(y, nfft)
    r = np.fft.irfft(f * np.conj(f), nfft)[: max_lag + 1]
    r = r / (n - np.arange(max_lag + 1))  # unbiased: long lags overlap fewer samples
    return r / r[0] if r[0] > 0 else r


def _refine(y: np.ndarray, coarse_lag: float) -> float:
    """Mean period (in samples) from the phase of the band-passed analytic signal around 1/coarse_lag.

    The unwrapped phase advances 2π per iteration, so its slope counts iterations per sample: that is the
    mean period over the window even when the period drifts (a spectral peak would favour one stretch).
    """
    n = y.size
    spec = np.fft.fft(y)
    freqs = np.fft.fftfreq(n)
    f0 = 1.0 / coarse_lag
    band = (freqs >= f0 / BAND_LOW) & (freqs <= min(f0 * BAND, 0.5))
    z = np.fft.ifft(np.where(band, 2.0 * spec, 0.0))  # analytic signal of the band
    trim = max(1, n // 20)  # the band-pass rings at the window edges
    phase = np.unwrap(np.angle(z))[trim:n - trim]
    t = np.arange(trim, n - trim)
    slope = np.polyfit(t, phase, 1)[0]
    if not np.isfinite(slope) or slope <= 0:
        return coarse_lag
    return 2.0 * np.pi / slope


def detect_period(ts: np.ndarray, values: np.ndarray, *, signal: str | None = None) -> PeriodResult | None:
    """The dominant repetition period of a telemetry series, or None when it is not periodic."""
    u = _uniform(np.asarray(ts, dtype=np.float64), np.asarray(values, dtype=np.float64))
    if u is None:
        return None
    dt, y = u
    n = y.size
    max_lag = n // 3
    if max_lag < 4:
        return None
    y = _detrend(y, max_lag)
    if float(np.std(y)) == 0.0:
        return None
    y = (y - y.mean()) / y.std()
    r = _acf(y, max_lag)
    inner = r[1:-1]
    peaks = np.flatnonzero((inner > r[:-2]) & (inner >= r[2:])) + 1
    peaks = peaks[(peaks >= 2) & (r[peaks] >= MIN_ACF_PEAK)]
    if peaks.size == 0:
        return None
    best = float(np.max(r[peaks]))
    lag = int(peaks[np.argmax(r[peaks] >= FUNDAMENTAL_RATIO * best)])
    # Sub-sample position of the ACF peak, the starting point for the spectral refinement.
    a, b, c = r[lag - 1], r[lag], r[lag + 1]
    denom = a - 2 * b + c
    coarse = lag + (0.5 * (a - c) / denom if denom != 0 else 0.0)
    refined = _refine(y, coarse)
    return PeriodResult(period_s=refined * dt, confidence=float(r[lag]), signal=signal)


def telemetry_period(gpus: list[GpuSeries],
                     signals: tuple[str, ...] = ("power_w", "gpu_util_pct", "memory_used_bytes")
                     ) -> PeriodResult | None:
    """Best period over the job's signals, taken on the first GPU that has each signal (data-parallel
    ranks run in lock-step, so one GPU speaks for all and the cost stays bounded)."""
    best: PeriodResult | None = None
    for name in signals:
        gpu = next((g for g in gpus if g.has(name)), None)
        if gpu is None:
            continue
        res = detect_period(gpu.ts, gpu.column(name), signal=name)
        if res is not None and (best is None or res.confidence > best.confidence):
            best = res
    return best


def hook_period_s(steps: StepSeries | None) -> float | None:
    """Median step wall time over all ranks and steps: the period the hooks measured."""
    if steps is None or len(steps) == 0:
        return None
    w = np.asarray(steps.wall_s, dtype=np.float64)
    w = w[~np.isnan(w)]
    return float(np.median(w)) if w.size else None


@dataclass(frozen=True)
class HookCheck:
    hook_period_s: float | None
    agrees_with_hooks: bool | None = None  # None: one of the two periods is unknown
    steps_per_period: int | None = None


def cross_check(telemetry_s: float | None, hooks_s: float | None) -> HookCheck:
    """Compare the two periods; a telemetry period that is a whole multiple of the step time is reported as
    such (gradient accumulation, periodic evaluation or checkpointing repeat every k steps)."""
    if telemetry_s is None or hooks_s is None or hooks_s <= 0:
        return HookCheck(hook_period_s=hooks_s)
    ratio = telemetry_s / hooks_s
    k = max(1, round(ratio))
    agrees = bool(abs(ratio / k - 1.0) <= AGREEMENT_TOL)
    return HookCheck(hook_period_s=hooks_s, agrees_with_hooks=agrees, steps_per_period=k if agrees else None)


def input_stalls(ts: np.ndarray, util_pct: np.ndarray) -> InputStalls:
    """Utilization dips while the job is otherwise busy: samples below a fifth of the job's busy level (p90),
    i.e. the GPU all but idle (a communication or optimizer phase still runs kernels; waiting for input
    does not).

    Dips that repeat with a period point at the input pipeline (every k steps the loader falls behind) or
    at periodic checkpointing; scattered dips are noise or communication.
    """
    unknown = InputStalls(stall_fraction=None, periodic=None, stall_period_s=None)
    u = np.asarray(util_pct, dtype=np.float64)
    ok = ~np.isnan(u)
    if ok.sum() < 16:
        return unknown
    busy_level = float(np.percentile(u[ok], 90))
    if busy_level < 20.0:
        return unknown  # an idle GPU has no stalls to speak of
    dip = (u < 0.2 * busy_level) & ok
    stall_fraction = float(dip[ok].mean())
    if stall_fraction <= 0.02:
        return InputStalls(stall_fraction=stall_fraction, periodic=False, stall_period_s=None)
    res = detect_period(np.asarray(ts, dtype=np.float64), dip.astype(np.float64))
    periodic = bool(res is not None and res.confidence >= 0.3)
    return InputStalls(stall_fraction=stall_fraction, periodic=periodic,
                       stall_period_s=res.period_s if res is not None and periodic else None)


def rank_stragglers(rank: np.ndarray, wall_s: np.ndarray, *, tol: float = 0.1) -> Stragglers:
    """Ranks whose median step time exceeds the median of per-rank medians by more than `tol`."""
    rank = np.asarray(rank)
    wall = np.asarray(wall_s, dtype=np.float64)
    ok = ~np.isnan(wall)
    rank, wall = rank[ok], wall[ok]
    if wall.size == 0:
        return Stragglers(ranks=0, median_step_s=None, stragglers=[])
    ranks = np.unique(rank)
    medians = np.array([np.median(wall[rank == r]) for r in ranks])
    job_median = float(np.median(medians))
    if ranks.size < 2 or job_median <= 0:
        return Stragglers(ranks=int(ranks.size), median_step_s=job_median, stragglers=[])
    slow = medians > (1.0 + tol) * job_median
    return Stragglers(ranks=int(ranks.size), median_step_s=job_median, stragglers=[
        # gpu_uuid left unset: only the NVML-only analysis (not written yet) names a GPU
        Straggler.model_validate({"rank": int(r), "median_step_s": float(m),
                                  "slowdown_fraction": float(m / job_median - 1.0)})
        for r, m in zip(ranks[slow], medians[slow], strict=True)
    ])


@dataclass(frozen=True)
class GpuImbalance:
    gpu_util_spread_pct: float | None  # highest - lowest mean utilization across the job's GPUs
    least_busy_gpu: str | None


def gpu_imbalance(gpus: list[GpuSeries]) -> GpuImbalance:
    """Spread of mean utilization across a job's GPUs (a lagging or starved GPU shows up here)."""
    means = []
    for g in gpus:
        u = g.column("gpu_util_pct")
        if not np.all(np.isnan(u)):
            means.append((g.uuid, float(np.nanmean(u))))
    if len(means) < 2:
        return GpuImbalance(gpu_util_spread_pct=None, least_busy_gpu=None)
    lo = min(means, key=lambda x: x[1])
    hi = max(means, key=lambda x: x[1])
    return GpuImbalance(gpu_util_spread_pct=hi[1] - lo[1], least_busy_gpu=lo[0])
