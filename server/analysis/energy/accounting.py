"""Energy: from the NVML total-energy counter where it counts, else the integral of power, and say which.

The counter (Volta+, converted from mJ to J by the agent) is exact over any interval, gaps included. Power
samples are an estimate: `power_w` is the interval's mean of the driver's 1-s means or of 10 Hz instantaneous
readings (`power_source` says which), so integrating it with trapezoids is only as good as the sampling. Per
interval between two samples we take the counter delta when both ends have a counter and it did not go backwards;
a negative delta means the counter was reset (driver reload, GPU reset) or wrapped, and that one interval falls
back to power.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetprof.report import EnergySection
from server.analysis.base.jobdata import EnergySettings, GpuSeries, jsonable

J_PER_KWH = 3.6e6
# NVML utilization.gpu below this is an idle GPU (a kernel ran less than 5% of the sample period).
IDLE_UTIL_PCT = 5.0


@dataclass
class EnergyIntervals:
    """Per-interval energy between consecutive samples (length n−1); NaN where neither source covers it."""

    energy_j: np.ndarray
    from_counter: np.ndarray  # bool
    from_power: np.ndarray  # bool

    @property
    def source(self) -> str | None:
        c, p = bool(self.from_counter.any()), bool(self.from_power.any())
        if c and p:
            return "mixed"
        if c:
            return "hardware_counter"
        if p:
            return "integrated_power"
        return None


def trapezoid_j(ts: np.ndarray, power_w: np.ndarray) -> float:
    """Plain trapezoidal integral of power over time, NaN intervals skipped (the reference we match)."""
    ts, power_w = np.asarray(ts, dtype=np.float64), np.asarray(power_w, dtype=np.float64)
    if ts.size < 2:
        return 0.0
    seg = 0.5 * (power_w[1:] + power_w[:-1]) * np.diff(ts)
    return float(np.nansum(seg))


def interval_energy(ts: np.ndarray, energy_counter_j: np.ndarray, power_w: np.ndarray, *,
                    max_power_gap_s: float | None = None) -> EnergyIntervals:
    """Energy per sampling interval: from the hardware counter where it brackets the interval, else the trapezoid
    of power.

    The agent reads the counter on some rows only (it costs ~3 ms of driver CPU per GPU: every 60th reading; see
    agent/sampler.py), so a counter delta spans the intervals between two readings. That delta is exact; it is
    shared out over those intervals in proportion to their power trapezoids (by duration where a power reading
    is missing), so each interval's energy adds up to the counter's and is marked as from the counter. A delta
    that goes down (a counter reset) is not used: its intervals fall back to power.

    `max_power_gap_s`: an interval longer than this has no power-integrated energy (unknown, not guessed):
    power sampled before and after an outage says nothing about the outage. Counter deltas are exact across
    gaps and always kept.
    """
    ts = np.asarray(ts, dtype=np.float64)
    counter = np.asarray(energy_counter_j, dtype=np.float64)
    power = np.asarray(power_w, dtype=np.float64)
    if ts.size < 2:
        e = np.empty(0)
        return EnergyIntervals(e, e.astype(bool), e.astype(bool))
    dt = np.diff(ts)
    trap = 0.5 * (power[1:] + power[:-1]) * dt
    n = dt.size
    energy_c = np.full(n, np.nan)
    counter_ok = np.zeros(n, dtype=bool)
    known = np.flatnonzero(~np.isnan(counter))
    if known.size >= 2:
        # interval i lies between rows i and i+1: bracketed by the last reading at or before row i (segment k)
        # and the next reading, known[k + 1]
        seg = np.searchsorted(known, np.arange(n), side="right") - 1
        inside = (seg >= 0) & (seg < known.size - 1)
        seg_c = np.clip(seg, 0, known.size - 2)
        delta = counter[known[1:]] - counter[known[:-1]]  # per segment
        ok = inside & (delta[seg_c] >= 0)
        if ok.any():
            segments = known.size - 1
            no_power = np.bincount(seg_c[ok], weights=np.isnan(trap[ok]).astype(float), minlength=segments) > 0
            weight = np.where(no_power[seg_c] | np.isnan(trap), dt, trap)
            weight = np.where(ok, np.maximum(weight, 0.0), 0.0)
            totals = np.bincount(seg_c[ok], weights=weight[ok], minlength=segments)
            spans = np.bincount(seg_c[ok], weights=dt[ok], minlength=segments)
            with np.errstate(invalid="ignore", divide="ignore"):
                share = np.where(totals[seg_c] > 0, weight / totals[seg_c], dt / spans[seg_c])
            energy_c = np.where(ok, delta[seg_c] * share, np.nan)
            counter_ok = ok & ~np.isnan(energy_c)
    power_ok = ~np.isnan(trap) & ~counter_ok
    if max_power_gap_s is not None:
        power_ok &= dt <= max_power_gap_s
    energy = np.where(counter_ok, energy_c, np.where(power_ok, trap, np.nan))
    return EnergyIntervals(energy_j=energy, from_counter=counter_ok, from_power=power_ok)


@dataclass
class GpuEnergy:
    energy_j: float | None
    source: str | None
    covered_s: float  # time covered by known intervals
    mean_power_w: float | None
    idle_energy_j: float | None
    counter_resets: int
    uncovered_s: float  # time between samples with neither a counter delta nor two power readings


def gpu_energy(gpu: GpuSeries) -> GpuEnergy:
    counter = gpu.column("energy_counter_j")
    power = gpu.column("power_w")
    iv = interval_energy(gpu.ts, counter, power)
    if iv.energy_j.size == 0 or not (iv.from_counter.any() or iv.from_power.any()):
        return GpuEnergy(None, None, 0.0, None, None, 0, 0.0)
    dt = np.diff(gpu.ts)
    known = iv.from_counter | iv.from_power
    total = float(np.sum(iv.energy_j[known]))
    covered = float(np.sum(dt[known]))
    d_counter = np.diff(counter)
    with np.errstate(invalid="ignore"):
        resets = int(np.count_nonzero(d_counter < 0))
    util = gpu.column("gpu_util_pct")
    idle: float | None = None
    if not np.all(np.isnan(util)):
        # An interval is idle when the GPU was idle at both of its ends: a ramp is not idle time.
        with np.errstate(invalid="ignore"):
            idle_mask = (util[1:] < IDLE_UTIL_PCT) & (util[:-1] < IDLE_UTIL_PCT) & known
        idle = float(np.sum(iv.energy_j[idle_mask]))
    return GpuEnergy(
        energy_j=total,
        source=iv.source,
        covered_s=covered,
        mean_power_w=total / covered if covered > 0 else None,
        idle_energy_j=idle,
        counter_resets=resets,
        uncovered_s=float(np.sum(dt[~known])),
    )


def combine_sources(sources: list[str | None]) -> str | None:
    known = {s for s in sources if s}
    if not known:
        return None
    if len(known) == 1:
        return known.pop()
    return "mixed"


@dataclass(frozen=True)
class EnergyCosts:
    kwh: float | None  # at the GPUs
    facility_kwh: float | None  # x PUE
    co2e_g: float | None
    cost_usd: float | None


def energy_costs(energy_j: float | None, settings: EnergySettings) -> EnergyCosts:
    """kWh at the GPU, then facility energy (× PUE) for CO2e and cost: the grid pays for the cooling too."""
    if energy_j is None:
        return EnergyCosts(kwh=None, facility_kwh=None, co2e_g=None, cost_usd=None)
    kwh = energy_j / J_PER_KWH
    facility = kwh * settings.pue
    return EnergyCosts(kwh=kwh, facility_kwh=facility, co2e_g=facility * settings.grid_intensity_g_per_kwh,
                       cost_usd=facility * settings.price_per_kwh_usd)


def per_unit(energy_j: float | None, units: float | None) -> float | None:
    """Energy per step / per sample; None when either side is unknown or there are no units."""
    if energy_j is None or not units:
        return None
    return energy_j / units


def energy_section(gpus: list[GpuEnergy], *, steps: int | None, samples: int | None,
                   settings: EnergySettings) -> EnergySection:
    """The job's energy: the sum over its GPUs (a lower bound when some have neither counter nor power, which
    `gpus_without_energy` counts), per step and sample, and what it costs at the grid."""
    known = [e for e in gpus if e.energy_j is not None]
    energy_j = sum(e.energy_j for e in known) if known else None  # type: ignore[misc]
    idle_known = [e.idle_energy_j for e in known if e.idle_energy_j is not None]
    costs = energy_costs(energy_j, settings)
    return EnergySection.model_validate(jsonable({
        "energy_j": energy_j,
        "source": combine_sources([e.source for e in gpus]),
        # Job draw = sum of its GPUs' mean draws.
        "mean_power_w": sum(e.mean_power_w for e in known if e.mean_power_w is not None) if known else None,
        "energy_per_step_j": per_unit(energy_j, steps),
        "per_sample_j": per_unit(energy_j, samples),
        "kwh": costs.kwh,
        "facility_kwh": costs.facility_kwh,
        "co2e_g": costs.co2e_g,
        "cost_usd": costs.cost_usd,
        "idle_energy_j": sum(idle_known) if idle_known else None,
        "idle_energy_fraction": (sum(idle_known) / energy_j) if (idle_known and energy_j) else None,
        "gpus_without_energy": len(gpus) - len(known),
        "counter_resets": sum(e.counter_resets for e in gpus),
        "covered_s": max((e.covered_s for e in known), default=0.0),
        "grid_intensity_g_per_kwh": settings.grid_intensity_g_per_kwh,
        "pue": settings.pue,
        "price_per_kwh_usd": settings.price_per_kwh_usd,
    }))
