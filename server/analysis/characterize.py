"""One job's characterization report: memory, time, utilization, energy, recommendations.

`characterize_report` is pure: it builds each section (`fleetprof.report`, validated once, here) from its
analyzer's result and assembles the typed `JobReport`; `characterize` is its JSON document, which the Celery
task caches per (job, ANALYZER_VERSION). Keys follow PRODUCT.md ("add fields freely, never rename"); `sources`
says where each headline figure came from, because NVML and the framework hooks measure different things.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fleetprof.report import (
    EnergySection,
    GpuReport,
    JobReport,
    MemorySection,
    Recommendation,
    Sources,
    TimeSection,
    UtilizationSection,
)
from server.analysis import energy as energy_mod
from server.analysis import iterations, memory, rightsizing, timing
from server.analysis.jobdata import GpuSeries, JobData, jsonable

log = logging.getLogger(__name__)

# Bump whenever a figure's definition changes: cached reports of older versions are recomputed.
ANALYZER_VERSION = 2


def job_duration_s(job: JobData, *, now: float) -> float | None:
    """Registered start to end (or to now while running); the sample span when the job was not registered."""
    if job.started_at is not None:
        end = job.ended_at if job.ended_at is not None else now
        return max(0.0, end - job.started_at)
    spans = [(float(g.ts[0]), float(g.ts[-1])) for g in job.gpus if g.ts.size]
    if not spans:
        return None
    return max(e for _, e in spans) - min(s for s, _ in spans)


def _utilization(gpus: list[GpuSeries]) -> UtilizationSection:
    """Plain sample means over all samples of all the job's GPUs."""
    def pooled(name: str) -> np.ndarray:
        arrs = [g.column(name) for g in gpus]
        a = np.concatenate(arrs) if arrs else np.empty(0)
        return a[~np.isnan(a)]

    u, m = pooled("gpu_util_pct"), pooled("mem_util_pct")
    return UtilizationSection(
        gpu_mean_pct=float(np.mean(u)) if u.size else None,
        gpu_p95_pct=float(np.percentile(u, 95)) if u.size else None,
        # NVML utilization.memory: share of time the memory controller was busy (not capacity used).
        memory_mean_pct=float(np.mean(m)) if m.size else None,
    )


def characterize(job: JobData, *, now: float) -> dict[str, Any]:
    """The report as the JSON document that is stored and served (the keys `characterize_report` set)."""
    return characterize_report(job, now=now).model_dump(mode="json", exclude_unset=True)


def characterize_report(job: JobData, *, now: float) -> JobReport:
    sources: dict[str, str | None] = {}

    # ---- memory
    gmem = [memory.gpu_memory(g) for g in job.gpus]
    fw = memory.framework_peaks(job.steps)
    mem = memory.memory_section(job, gmem, fw)
    top = memory.largest_peak(gmem)
    sources["memory.peak_used_bytes"] = top.source if top else None
    sources["memory.peak_allocated_bytes"] = fw["source"] if fw["peak_allocated_bytes"] is not None else None
    sources["memory.peak_reserved_bytes"] = fw["source"] if fw["peak_reserved_bytes"] is not None else None
    sources["memory.fragmentation_bytes"] = ("framework:reserved-allocated" if fw["fragmentation_bytes"] is not None
                                             else None)
    sources["memory.process_peak_bytes"] = ("nvml:per-process used memory" if mem.process_peak_bytes is not None
                                            else None)

    # ---- time
    st = timing.step_stats(job.steps)
    busy = timing.busy_fraction(job.gpus)
    period = iterations.telemetry_period(job.gpus)
    hook_s = iterations.hook_period_s(job.steps)
    check = iterations.cross_check(period.period_s if period else None, hook_s)
    stalls = _stalls(job.gpus)
    stragglers = (iterations.rank_stragglers(job.steps.rank, job.steps.wall_s)
                  if job.steps is not None and len(job.steps) else None)
    time_block = {
        "steps": st["steps"],
        "step_time_s": st["step_time_s"],
        "warmup_steps_excluded": st["warmup_steps_excluded"],
        "samples": st["samples"],
        "samples_per_s": st["samples_per_s"],
        "device_time_fraction": st["device_time_fraction"],
        "period_s": period.period_s if period else None,
        "period_confidence": period.confidence if period else None,
        "period_signal": period.signal if period else None,
        **check,
        "gpu_busy_fraction": busy["gpu_busy_fraction"],
        "gpu_active_sample_fraction": busy["gpu_active_sample_fraction"],
        "input_stalls": stalls,
        "stragglers": stragglers,
        **iterations.gpu_imbalance(job.gpus),
        "layers": timing.layer_table(job.layers, job.layer_step_s),
        "layers_step_time_s": job.layer_step_s,
        "trace_summaries": job.trace_summaries,
    }
    sources["time.steps"] = "framework" if st["steps"] is not None else None
    sources["time.period_s"] = f"telemetry:{period.signal}" if period else None
    sources["time.layers"] = ("framework hooks: time_fraction = inclusive time (children included) / "
                              "layers_step_time_s (mean wall time of the sampled steps); self_time_fraction = "
                              "without children"
                              if job.layers else None)
    sources["time.gpu_busy_fraction"] = "nvml:mean(gpu_util_pct)/100" if busy["gpu_busy_fraction"] is not None else None

    duration = job_duration_s(job, now=now)
    # ---- energy, per GPU then summed
    genergy = [energy_mod.gpu_energy(g) for g in job.gpus]
    energy = energy_mod.energy_section(genergy, steps=st["steps"], samples=st["samples"],
                                       settings=job.energy_settings)
    sources["energy.energy_j"] = energy.source
    sources["energy.energy_per_step_j"] = "energy/framework_steps" if energy.energy_per_step_j is not None else None

    util = _utilization(job.gpus)
    sources["utilization.gpu_mean_pct"] = "nvml:gpu_util_pct" if util.gpu_mean_pct is not None else None
    sources["utilization.memory_mean_pct"] = "nvml:mem_util_pct" if util.memory_mean_pct is not None else None

    gpus_out = []
    for g, m, e in zip(job.gpus, gmem, genergy, strict=True):
        u = g.column("gpu_util_pct")
        gpus_out.append({
            "uuid": g.uuid, "name": g.name, "memory_total_bytes": m.memory_total_bytes,
            "peak_used_bytes": m.peak_used_bytes, "headroom_bytes": m.headroom_bytes,
            "peak_used_fraction": m.peak_used_fraction,
            "energy_j": e.energy_j, "energy_source": e.source, "mean_power_w": e.mean_power_w,
            "idle_energy_j": e.idle_energy_j, "counter_resets": e.counter_resets,
            "power_source": g.power_source,
            "gpu_util_mean_pct": None if np.all(np.isnan(u)) else float(np.nanmean(u)),
            "samples": int(g.ts.size),
            "first_ts": float(g.ts[0]) if g.ts.size else None,
            "last_ts": float(g.ts[-1]) if g.ts.size else None,
        })

    raw: dict[str, Any] = {
        "job_id": job.job_id,
        "state": job.state,
        "analyzed_at": now,
        "analyzer_version": ANALYZER_VERSION,
        "duration_s": duration,
        "name": job.name,
        "team": job.team,
        "batch_size": job.batch_size,
        "gpus": gpus_out,
        "memory": mem.model_dump(),
        "time": time_block,
        "utilization": util.model_dump(),
        "energy": energy.model_dump(),
        "sources": sources,
    }
    raw["rightsizing_inputs"] = rightsizing.inputs_from_report(raw, job)
    raw["recommendations"] = rightsizing.job_recommendations(raw)
    if energy.gpus_without_energy and energy.energy_j is not None:
        # The sum is then a lower bound; the report says how many GPUs it misses.
        log.info("job %s: %d of %d GPUs have neither energy counter nor power samples",
                 job.job_id, energy.gpus_without_energy, len(job.gpus))
    log.debug("characterized job %s: %d GPUs, %d samples, source=%s", job.job_id, len(job.gpus),
              sum(g.ts.size for g in job.gpus), energy.source)
    # The analyzers' figures may be numpy scalars or NaN: made JSON-safe first, then validated once, here.
    return _assemble(jsonable(raw), mem, util, energy)


def _assemble(doc: dict[str, Any], mem: MemorySection, util: UtilizationSection,
              energy: EnergySection) -> JobReport:
    """The typed report from its JSON-safe sections (the one place they are validated)."""
    return JobReport(
        **{k: doc[k] for k in ("job_id", "state", "analyzed_at", "analyzer_version", "duration_s", "name", "team",
                               "batch_size", "rightsizing_inputs")},
        gpus=[GpuReport.model_validate(g) for g in doc["gpus"]],
        memory=mem,
        time=TimeSection.model_validate(doc["time"]),
        utilization=util,
        energy=energy,
        sources=Sources.model_validate(doc["sources"]),
        recommendations=[Recommendation.model_validate(r) for r in doc["recommendations"]],
    )


def _stalls(gpus: list[GpuSeries]) -> dict[str, Any]:
    """Input stalls on the busiest-looking GPU with utilization (one GPU: DP ranks stall together)."""
    with_util = [g for g in gpus if g.has("gpu_util_pct")]
    if not with_util:
        return iterations.input_stalls(np.empty(0), np.empty(0))
    g = with_util[0]
    return iterations.input_stalls(g.ts, g.column("gpu_util_pct"))
