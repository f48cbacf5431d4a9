"""Right-sizing in the manner of the Kubernetes VPA recommender, for GPU jobs.

Inputs are the `rightsizing_inputs` block of characterization reports (one per run of a job or of a
recurring job name), so answering a scheduler never touches raw samples. Every recommendation carries
kind, summary, reason, evidence and saving (None when the saving cannot be known).

Memory follows VPA: peaks per interval, a high percentile plus a safety margin, bounds widened while the
history is short (confidence grows with days of history), a bump after an OOM. Unlike CPU, a GPU memory
overflow kills the job, so the target never drops below the largest peak observed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetprof.api_models import Band, CandidateGpu
from fleetprof.report import Recommendation
from server.analysis.base.gpu_catalog import GpuModel, find_model, load_catalog
from server.analysis.base.jobdata import JobData, jsonable
from server.analysis.energy.power_limit import job_power_limit_w
from server.analysis.fleet.batch_sizing import SAFETY_MARGIN_FRACTION, batch_size_advice
from server.analysis.fleet.rollup import rollup_gpus
from server.analysis.projection.calibrate import FleetPairs, fingerprint_calibration
from server.analysis.projection.inputs import NotEnoughData, measured_from_inputs
from server.analysis.projection.project import project

TARGET_PERCENTILE = 95.0
OOM_BUMP_FRACTION = 0.2  # VPA: memory × 1.2 after an OOM ...
OOM_MIN_BUMP_BYTES = 100 * 2**20  # ... and at least +100 MiB
LOW_UTIL_PCT = 40.0  # mean GPU utilization under which a multi-GPU job is over-provisioned
TARGET_UTIL_PCT = 70.0  # utilization to aim for when shrinking a job's GPU count
MAX_SLOWDOWN_FRACTION = 0.10  # power cap: least energy among caps at most 10% slower than the fastest


def recommendation(kind: str, summary: str, reason: str, evidence: Mapping[str, Any],
                   saving: Mapping[str, Any] | None) -> Recommendation:
    return Recommendation.model_validate(jsonable({"kind": kind, "summary": summary, "reason": reason,
                                                   "evidence": evidence, "saving": saving}))


# ---------------------------------------------------------------- memory (VPA)


# Confidence in words, from days of history (VPA's confidence): under a day the bounds are wide.
CONFIDENCE_LEVELS = ((1.0, "low"), (7.0, "medium"), (math.inf, "high"))


@dataclass
class MemoryTarget:
    target_bytes: int
    lower_bound_bytes: int
    upper_bound_bytes: int
    observed_peak_bytes: int
    confidence: float  # days of history, VPA-style
    oom_bump: bool
    upper_bound_capped_at: str | None = None  # what bounded the upper bound below VPA's widening, if anything

    @property
    def confidence_level(self) -> str:
        return next(level for days, level in CONFIDENCE_LEVELS if self.confidence < days)


def vpa_memory_target(interval_peaks_bytes: Sequence[float], *, history_s: float, oom: bool = False,
                      oom_capacity_bytes: int | None = None, capacity_bytes: int | None = None,
                      capacity_source: str = "gpu_capacity",
                      margin: float = SAFETY_MARGIN_FRACTION) -> MemoryTarget | None:
    """Recommended device memory from per-interval peaks (e.g. hourly peaks of each run).

    VPA widens the upper bound by 1 + 1/confidence_days, without limit: 10 minutes of history gave x145 (tens of
    TB for an 80 GB GPU). A run that did not run out of memory needed at most its GPU's memory, so the upper bound
    never exceeds `capacity_bytes` (the largest GPU the runs had, else the caller's physical limit) unless the
    target itself does (after an OOM)."""
    p = np.asarray([x for x in interval_peaks_bytes if x is not None], dtype=np.float64)
    p = p[~np.isnan(p)]
    if p.size == 0:
        return None
    observed = float(p.max())
    # VPA: confidence = history length in days; the bounds tighten as it grows.
    confidence = max(history_s / 86_400.0, 1e-3)
    target = max(float(np.percentile(p, TARGET_PERCENTILE)) * (1 + margin), observed)
    upper = target * (1 + 1.0 / confidence)
    lower = float(np.percentile(p, 50)) * (1 + 0.001 / confidence) ** -2
    capped = None
    if capacity_bytes is not None and upper > max(float(capacity_bytes), target):
        upper, capped = max(float(capacity_bytes), target), capacity_source
    if oom:
        # The job wanted more than it had: start from the capacity it ran out of when we know it.
        base = max(observed, float(oom_capacity_bytes or 0))
        bumped = max(base * (1 + OOM_BUMP_FRACTION), base + OOM_MIN_BUMP_BYTES)
        target, upper = max(target, bumped), max(upper, bumped)
    return MemoryTarget(math.ceil(target), int(min(lower, target)), math.ceil(upper), int(observed), confidence, oom,
                        capped)


def smallest_fitting_gpu(required_bytes: float, catalog: Sequence[GpuModel] | None = None) -> GpuModel | None:
    """Least memory that holds `required_bytes` (ties: the cheaper one); None when nothing fits."""
    fits = [m for m in (catalog or load_catalog()) if m.memory_bytes >= required_bytes]
    if not fits:
        return None
    return min(fits, key=lambda m: (m.memory_bytes, m.price_per_hour_usd or math.inf))


# ---------------------------------------------------------------- power cap


def power_cap_choice(runs: Sequence[tuple[float, float, float]], *,
                     max_slowdown: float = MAX_SLOWDOWN_FRACTION) -> dict[str, Any] | None:
    """Runs as (power_limit_w, energy_j, time_s) for the same unit of work (an epoch, a window of steps).

    Picks the least energy among caps no more than `max_slowdown` slower than the fastest; None with fewer
    than two distinct caps (then it needs measuring). Zeus (NSDI'23) sweeps caps the same way.
    """
    by_cap: dict[float, tuple[float, float]] = {}
    for cap, e, t in runs:
        if cap is None or e is None or t is None:
            continue
        # Several runs at one cap: average them.
        pe, pt = by_cap.get(cap, (0.0, 0.0))
        by_cap[cap] = (pe + e, pt + t)
    counts = {cap: sum(1 for c, e, t in runs if c == cap and e is not None and t is not None) for cap in by_cap}
    if len(by_cap) < 2:
        return None
    rows = [(cap, e / counts[cap], t / counts[cap]) for cap, (e, t) in by_cap.items()]
    fastest = min(t for _, _, t in rows)
    ok = [r for r in rows if r[2] <= fastest * (1 + max_slowdown)]
    best = min(ok, key=lambda r: r[1])
    top = max(rows, key=lambda r: r[0])  # the highest cap stands for "uncapped"
    return {"power_limit_w": best[0], "energy_j": best[1], "time_s": best[2],
            "baseline_power_limit_w": top[0], "baseline_energy_j": top[1], "baseline_time_s": top[2],
            "energy_saving_fraction": 1 - best[1] / top[1] if top[1] > 0 else None,
            "slowdown_fraction": best[2] / top[2] - 1 if top[2] > 0 else None,
            "caps_measured": sorted(by_cap),
            # every cap measured, highest first: (W, J per unit of work, s per unit of work), runs averaged
            "per_cap": [{"power_limit_w": cap, "energy_j": e, "time_s": t}
                        for cap, e, t in sorted(rows, key=lambda r: -r[0])]}


# ---------------------------------------------------------------- report glue


def inputs_from_report(report: Mapping[str, Any], job: JobData) -> dict[str, Any]:
    """The per-run facts right-sizing needs, stored in the report so history queries stay cheap."""
    peaks: list[float] = []
    if job.gpus:
        r = rollup_gpus(job.gpus)
        hours, mem = r["hour_start"], r["memory_peak_bytes"]
        ok = ~np.isnan(mem)
        for h in np.unique(hours[ok]):
            peaks.append(float(mem[ok][hours[ok] == h].max()))  # the largest GPU's peak in that hour
    mem = report["memory"]
    gpus = report["gpus"]
    names = [g["name"] for g in gpus if g.get("name")]
    t = report["time"]
    return {
        "job_id": report["job_id"],
        "name": report.get("name"),
        "gpu_name": names[0] if names else job.gpu_type_requested,
        "gpu_count": len(gpus) or job.gpus_requested,
        "memory_total_bytes": mem.get("memory_total_bytes"),
        "peak_used_bytes": mem.get("peak_used_bytes"),
        "peak_reserved_bytes": mem.get("peak_reserved_bytes"),
        "interval_peaks_bytes": peaks,
        "duration_s": report.get("duration_s"),
        "oom": bool(mem.get("oom_detected")),
        "batch_size": job.batch_size,
        "gpu_util_mean_pct": report["utilization"].get("gpu_mean_pct"),
        "step_time_s": (t.get("step_time_s") or {}).get("mean"),
        "energy_j": report["energy"].get("energy_j"),
        "energy_per_step_j": report["energy"].get("energy_per_step_j"),
        # The limit the samples carried (the mode over the job's GPUs); None when they did not carry one.
        "power_limit_w": job_power_limit_w(job.gpus),
        **framework_inputs(job),
    }


def framework_inputs(job: JobData) -> dict[str, Any]:
    """What the hooks read (batch-size right-sizing's one-run estimate and capacity); {} for a job without hooks."""
    fw = job.framework
    if fw is None:
        return {}
    keys = ("model_class", "parameter_count", "optimizers", "precision", "precision_source",
            "device_memory_total_bytes", "device_memory_source")
    return {**{k: fw.get(k) for k in keys}, "batch_size_source": fw.get("job_batch_size_source"),
            "memory_signal": job.steps.memory_source if job.steps is not None else None}


def _inputs(item: Mapping[str, Any]) -> Mapping[str, Any]:
    return item.get("rightsizing_inputs", item)


def rightsize(history: Sequence[Mapping[str, Any]], *, catalog: Sequence[GpuModel] | None = None,
              explain_missing: bool = True, fingerprint_runs: Sequence[Mapping[str, Any]] = (),
              fleet_pairs: FleetPairs | None = None) -> dict[str, Any]:
    """Recommendations from the runs of one job or recurring job name (reports or their
    `rightsizing_inputs`), newest last. `explain_missing`: a recommendation that cannot be made yet says what it
    needs (off for a job's own report, which shows what can be done)."""
    runs = [_inputs(h) for h in history]
    recs: list[Recommendation] = []
    out: dict[str, Any] = {"runs": len(runs), "memory": None, "recommendations": recs}
    if not runs:
        return out
    catalog = tuple(catalog or load_catalog())
    last = runs[-1]
    peaks = [p for r in runs for p in (r.get("interval_peaks_bytes") or [])]
    if not peaks:
        peaks = [r["peak_used_bytes"] for r in runs if r.get("peak_used_bytes") is not None]
    history_s = sum(r.get("duration_s") or 0.0 for r in runs)
    oom_runs = [r for r in runs if r.get("oom")]
    # The physical limit: the largest GPU the runs had, else (not known) the largest GPU in the catalogue.
    had = max((r.get("memory_total_bytes") or 0 for r in runs), default=0)
    capacity, capacity_source = ((had, "gpu_capacity") if had else
                                 (max((m.memory_bytes for m in catalog), default=None), "largest_catalogue_gpu"))
    target = vpa_memory_target(peaks, history_s=history_s, oom=bool(oom_runs),
                               oom_capacity_bytes=max((r.get("memory_total_bytes") or 0 for r in oom_runs),
                                                      default=None),
                               capacity_bytes=capacity, capacity_source=capacity_source)
    if target is not None:
        out["memory"] = {
            "target_bytes": target.target_bytes, "lower_bound_bytes": target.lower_bound_bytes,
            "upper_bound_bytes": target.upper_bound_bytes, "observed_peak_bytes": target.observed_peak_bytes,
            "confidence_days": target.confidence, "confidence": target.confidence_level,
            "history_s": history_s, "upper_bound_capped_at": target.upper_bound_capped_at,
            "oom_bump": target.oom_bump,
        }
        recs.extend(_gpu_type_recs(target, last, catalog))
    recs.extend(_gpu_count_recs(last))
    recs.extend(_batch_recs(runs, catalog, explain_missing=explain_missing))
    recs.append(_power_cap_rec(runs))
    try:
        out["projections"] = candidate_projections(last, catalog, fingerprint_runs=fingerprint_runs,
                                                   fleet_pairs=fleet_pairs)
        out["projection_unavailable"] = None
    except NotEnoughData as exc:
        out["projections"], out["projection_unavailable"] = [], str(exc)
    return out


def _ratio_band(b: Band, measured: float | None) -> Band | None:
    if measured is None or measured <= 0:
        return None
    return Band(central=b.central / measured, low=b.low / measured, high=b.high / measured)


def _more_or_less(ratio: Band | None, what: str) -> str | None:
    if ratio is None:
        return None
    change = ratio.central - 1.0
    return f"{abs(change) * 100:.0f} % {'less' if change < 0 else 'more'} {what}"


def candidate_projections(last: Mapping[str, Any], catalog: Sequence[GpuModel], *,
                          fingerprint_runs: Sequence[Mapping[str, Any]] = (),
                          fleet_pairs: FleetPairs | None = None) -> list[CandidateGpu]:
    """The latest run (its `rightsizing_inputs`) projected onto every other catalogue GPU type: ratios to what it
    measured, with their bands; cheapest per step first, then by step time. `fingerprint_runs`: the
    `rightsizing_inputs` of its model's runs (calibrate a type where some ran on it and on the run's type);
    `fleet_pairs`: the fleet's runs of any model (other models' pairs calibrate the rest).
    Raises NotEnoughData."""
    run = measured_from_inputs(last, catalog=tuple(catalog))
    out: list[CandidateGpu] = []
    for model in catalog:
        if model.name == run.gpu.name:
            continue
        calibration = fingerprint_calibration(last, fingerprint_runs, source=run.gpu, target=model,
                                              catalog=tuple(catalog)) if fingerprint_runs else None
        if calibration is None and fleet_pairs is not None:
            calibration = fleet_pairs.calibration(run.gpu, model)
        p = project(run, model, calibration=calibration)
        time_ratio = p.step_time_ratio
        cost = (_ratio_band(p.cost_per_step_usd, p.measured_cost_per_step_usd)
                if p.cost_per_step_usd is not None else None)
        energy = _ratio_band(p.energy_per_step_j, p.measured_energy_per_step_j)
        parts = [f"{time_ratio.central:.2f}x the step time [{time_ratio.low:.2f}-{time_ratio.high:.2f}]",
                 _more_or_less(cost, "cost per step"), _more_or_less(energy, "energy per step")]
        if p.memory.fits is False:
            parts.append("does not fit in memory")
        if calibration is not None:
            parts.append("measured on both types by this model's runs" if calibration.source == "fingerprint_runs"
                         else f"roofline corrected by {calibration.models} other models' runs on both types")
        out.append(CandidateGpu(gpu=model.name, summary=f"on {model.name}: " + ", ".join(x for x in parts if x),
                                basis=p.basis, step_time_ratio=time_ratio, cost_per_step_ratio=cost,
                                energy_per_step_ratio=energy, fits=p.memory.fits,
                                calibration_source=calibration.source if calibration is not None else None))
    return sorted(out, key=lambda c: (c.fits is False, c.cost_per_step_ratio.central if c.cost_per_step_ratio
                                      else math.inf, c.step_time_ratio.central))


def job_recommendations(report: Mapping[str, Any]) -> list[Recommendation]:
    """Recommendations for one job from its own run alone (the report's `recommendations[]`)."""
    recs = rightsize([report], explain_missing=False)["recommendations"]
    mem = report.get("memory") or {}
    frac = mem.get("fragmentation_fraction")
    if frac is not None and frac > 0.2 and mem.get("fragmentation_bytes"):
        recs.append(recommendation(
            "fragmentation",
            f"Allocator cache holds {mem['fragmentation_bytes'] / 2**30:.1f} GiB beyond the peak allocation",
            "reserved − allocated is over 20% of reserved at the high-water mark: the caching allocator keeps "
            "blocks it cannot reuse; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            {"fragmentation_bytes": mem["fragmentation_bytes"], "fragmentation_fraction": frac},
            {"bytes": mem["fragmentation_bytes"]}))
    return recs


def _gpu_hours(run: Mapping[str, Any]) -> float | None:
    d, n = run.get("duration_s"), run.get("gpu_count")
    return d * n / 3600.0 if (d is not None and n) else None


def _gpu_type_recs(target: MemoryTarget, last: Mapping[str, Any], catalog: Sequence[GpuModel]) -> list[Recommendation]:
    fit = smallest_fitting_gpu(target.target_bytes, catalog)
    current = find_model(last["gpu_name"], tuple(catalog)) if last.get("gpu_name") else None
    evidence = {"target_bytes": target.target_bytes, "observed_peak_bytes": target.observed_peak_bytes,
                "current_gpu": current.name if current else last.get("gpu_name"),
                "confidence_days": target.confidence, "confidence": target.confidence_level}
    if fit is None:
        return [recommendation(
            "gpu_type", "No single GPU in the catalogue holds this job's memory",
            f"target {target.target_bytes / 2**30:.1f} GiB exceeds every catalogue model: shard the model "
            "or offload", evidence, None)]
    if current is not None and fit.name == current.name:
        return []
    saving = None
    if current is not None and current.price_per_hour_usd and fit.price_per_hour_usd:
        gh = _gpu_hours(last)
        per_h = current.price_per_hour_usd - fit.price_per_hour_usd
        saving = {"usd_per_gpu_hour": per_h, "usd": per_h * gh if gh is not None else None}
    why = "after an out-of-memory failure, " if target.oom_bump else ""
    caveat = (f"; {target.confidence_level} confidence: {target.confidence * 24:.1f} h of history"
              if target.confidence_level != "high" else "")
    return [recommendation(
        "gpu_type", f"Run on {fit.name} ({fit.memory_bytes / 2**30:.0f} GiB)",
        f"{why}the smallest catalogue GPU that holds the VPA-style target of "
        f"{target.target_bytes / 2**30:.1f} GiB (p{TARGET_PERCENTILE:.0f} of hourly peaks "
        f"+{SAFETY_MARGIN_FRACTION:.0%}, never below the observed peak){caveat}",
        {**evidence, "recommended_memory_bytes": fit.memory_bytes}, saving)]


def _gpu_count_recs(last: Mapping[str, Any]) -> list[Recommendation]:
    n, util = last.get("gpu_count"), last.get("gpu_util_mean_pct")
    if not n or n < 2 or util is None or util >= LOW_UTIL_PCT:
        return []
    suggested = max(1, math.ceil(n * util / TARGET_UTIL_PCT))
    if suggested >= n:
        return []
    gh = _gpu_hours(last)
    return [recommendation(
        "gpu_count", f"Use {suggested} GPUs instead of {n}",
        f"mean utilization across the job's {n} GPUs was {util:.0f}%: the same work at "
        f"{TARGET_UTIL_PCT:.0f}% needs {suggested}; check that the per-GPU batch still fits",
        {"gpu_count": n, "gpu_util_mean_pct": util},
        {"gpus": n - suggested, "gpu_hours": gh * (n - suggested) / n if gh is not None else None})]


def _batch_recs(runs: Sequence[Mapping[str, Any]], catalog: Sequence[GpuModel], *,
                explain_missing: bool = True) -> list[Recommendation]:
    advice = batch_size_advice(runs, catalog)
    if advice is None or (advice.saving is None and "missing" in advice.evidence and not explain_missing):
        return []
    return [recommendation("batch_size", advice.summary, advice.reason, advice.evidence, advice.saving)]


def _power_cap_rec(runs: Sequence[Mapping[str, Any]]) -> Recommendation:
    pts = [(r.get("power_limit_w"), r.get("energy_per_step_j"), r.get("step_time_s")) for r in runs]
    # each run with its cap, energy and time per step (J, s: the run's report), so a sweep's table names its jobs
    measured = [{"job_id": r.get("job_id"), "power_limit_w": r.get("power_limit_w"),
                 "energy_per_step_j": r.get("energy_per_step_j"), "step_time_s": r.get("step_time_s")}
                for r in runs if r.get("power_limit_w") is not None]
    choice = power_cap_choice([p for p in pts if None not in p])  # type: ignore[misc]
    if choice is None:
        return recommendation(
            "power_cap", "Power cap needs measuring",
            "the job has not run at two or more power limits; a short sweep (as Zeus does; `fleetprof tune power`) "
            "measures energy and time per step at each cap",
            {"caps_measured": sorted({p[0] for p in pts if p[0]}), "runs": measured}, None)
    return recommendation(
        "power_cap", f"Cap power at {choice['power_limit_w']:.0f} W",
        f"least energy per step among caps at most {MAX_SLOWDOWN_FRACTION:.0%} slower than the fastest",
        {**choice, "runs": measured}, {"energy_fraction": choice["energy_saving_fraction"]})
