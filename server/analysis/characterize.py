"""One job's characterization report: memory, time, utilization, energy, recommendations.

`characterize_report` is pure: it builds each section (`fleetprof.report`, validated once, here) from its
analyzer's result and assembles the typed `JobReport`; `characterize` is its JSON document, which the Celery
task caches per (job, ANALYZER_VERSION). Keys follow PRODUCT.md ("add fields freely, never rename"); `sources`
says where each headline figure came from, because NVML and the framework hooks measure different things.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from fleetprof.report import FingerprintSection, FrameworkSection, GpuReport, JobReport, Sources, UtilizationSection
from server.analysis.base.jobdata import GpuSeries, JobData, jsonable
from server.analysis.energy import accounting as energy_mod
from server.analysis.energy.power_limit import gpu_setting
from server.analysis.fleet import rightsizing
from server.analysis.health.findings import health_section
from server.analysis.memory import usage as memory
from server.analysis.time import mfu as mfu_mod
from server.analysis.time import timing
from server.analysis.utilization import gpm

log = logging.getLogger(__name__)

# Bump whenever a figure's definition changes: cached reports of older versions are recomputed.
# 6: utilization.gpm (NVML GPM means, issue #20);
# 5: health findings, stragglers from NVML alone, MFU (issue 20);
# 4: framework section, GPU power limits, memory breakdown, fit and allocator advice (issues 17, 18);
# 3: other jobs' ids no longer in memory.processes (issue 15)
ANALYZER_VERSION = 6


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
    """Plain sample means over all samples of all the job's GPUs; GPM means per GPU (`utilization.gpm`)."""
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
        gpm=gpm.gpm_section(gpus),
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
    sources["memory.peak_allocated_bytes"] = fw.source if fw.peak_allocated_bytes is not None else None
    sources["memory.peak_reserved_bytes"] = fw.source if fw.peak_reserved_bytes is not None else None
    sources["memory.fragmentation_bytes"] = ("framework:reserved-allocated" if fw.fragmentation_bytes is not None
                                             else None)
    sources["memory.process_peak_bytes"] = ("nvml:per-process used memory" if mem.process_peak_bytes is not None
                                            else None)

    # ---- time
    tm = timing.time_section(job)
    sources["time.steps"] = "framework" if tm.steps is not None else None
    sources["time.period_s"] = f"telemetry:{tm.period_signal}" if tm.period_s is not None else None
    sources["time.layers"] = ("framework hooks: time_fraction = inclusive time (children included) / "
                              "layers_step_time_s (mean wall time of the sampled steps); self_time_fraction = "
                              "without children"
                              if job.layers else None)
    sources["time.gpu_busy_fraction"] = "nvml:mean(gpu_util_pct)/100" if tm.gpu_busy_fraction is not None else None

    # ---- energy, per GPU then summed
    genergy = [energy_mod.gpu_energy(g) for g in job.gpus]
    energy = energy_mod.energy_section(genergy, steps=tm.steps, samples=tm.samples,
                                       settings=job.energy_settings)
    sources["energy.energy_j"] = energy.source
    sources["energy.energy_per_step_j"] = "energy/framework_steps" if energy.energy_per_step_j is not None else None

    mfu = mfu_mod.mfu_section(job, steps=tm.steps, step_time_mean_s=tm.step_time_s.mean, period_s=tm.period_s)
    sources["mfu.mfu_fraction"] = (f"{mfu.flops_per_step_source} x {mfu.steps_per_s_source} / {mfu.peak_source}"
                                   if mfu.mfu_fraction is not None else None)

    # ---- health: slowdowns, clocks, temperature, XID and error counters per GPU
    health = health_section(job.gpus)
    sources["health.findings"] = ("nvml:clock event reasons, clocks, temperature, XID, ECC/retired pages/row "
                                  "remapping, PCIe replay, NVLink error counters")

    util = _utilization(job.gpus)
    sources["utilization.gpm"] = util.gpm.source if util.gpm is not None else None
    sources["utilization.gpu_mean_pct"] = "nvml:gpu_util_pct" if util.gpu_mean_pct is not None else None
    sources["utilization.memory_mean_pct"] = "nvml:mem_util_pct" if util.memory_mean_pct is not None else None

    gpus = [_gpu_report(g, m, e) for g, m, e in zip(job.gpus, gmem, genergy, strict=True)]
    if energy.gpus_without_energy and energy.energy_j is not None:
        # The sum is then a lower bound; the report says how many GPUs it misses.
        log.info("job %s: %d of %d GPUs have neither energy counter nor power samples",
                 job.job_id, energy.gpus_without_energy, len(job.gpus))
    log.debug("characterized job %s: %d GPUs, %d samples, source=%s", job.job_id, len(job.gpus),
              sum(g.ts.size for g in job.gpus), energy.source)

    head: dict[str, Any] = {"job_id": job.job_id, "state": job.state, "analyzed_at": now,
                            "analyzer_version": ANALYZER_VERSION, "duration_s": job_duration_s(job, now=now),
                            "name": job.name, "team": job.team, "batch_size": job.batch_size}
    sections = {"memory": mem, "time": tm, "utilization": util, "energy": energy}
    # Right-sizing reads the report as a document (also the stored reports of earlier runs).
    view: dict[str, Any] = {**head, "gpus": [g.model_dump() for g in gpus],
                            **{k: v.model_dump() for k, v in sections.items()}}
    view["rightsizing_inputs"] = jsonable(rightsizing.inputs_from_report(view, job))
    fw_section = framework_section(job.framework)
    framework: dict[str, Any] = {} if fw_section is None else {"framework": fw_section}  # unset without hooks
    fp_section = fingerprint_section(job.framework, batch_size=job.batch_size)
    if fp_section is not None:
        framework["fingerprint"] = fp_section
    return JobReport(**head, gpus=gpus, memory=mem, time=tm, utilization=util, energy=energy,
                     sources=Sources.model_validate(sources), **framework, health=health, mfu=mfu,
                     rightsizing_inputs=view["rightsizing_inputs"],
                     recommendations=rightsizing.job_recommendations(view))


def framework_section(info: dict[str, Any] | None) -> FrameworkSection | None:
    """The hooks' framework_info as the report's `framework` section (JobData.framework)."""
    if info is None:
        return None
    return FrameworkSection(
        batch_size_observed=info.get("batch_size"), batch_size_observed_source=info.get("batch_size_source"),
        batch_size_source=info.get("job_batch_size_source"), model_class=info.get("model_class"),
        parameter_count=info.get("parameter_count"), optimizers=info.get("optimizers"),
        precision=info.get("precision"), precision_source=info.get("precision_source"), device=info.get("device"),
        device_memory_total_bytes=info.get("device_memory_total_bytes"),
        device_memory_source=info.get("device_memory_source"), cuda_alloc_conf=info.get("cuda_alloc_conf"),
        flops_per_step=info.get("flops_per_step"), flops_per_step_source=info.get("flops_per_step_source"))


def fingerprint_section(info: dict[str, Any] | None, *, batch_size: int | None) -> FingerprintSection | None:
    """The report's `fingerprint` section from the hooks' framework_info; None when they sent no fingerprint."""
    if info is None or info.get("fingerprint") is None:
        return None
    return FingerprintSection(
        fingerprint=info["fingerprint"], module_tree_hash=info.get("module_tree_hash"),
        module_count=info.get("module_count"), model_class=info.get("model_class"),
        parameter_count=info.get("parameter_count"), optimizers=info.get("optimizers"),
        precision=info.get("precision_mode"), batch_size=batch_size if batch_size is not None else
        info.get("batch_size"), framework=info.get("framework"), framework_version=info.get("framework_version"),
        source="hooks")


def _gpu_report(g: GpuSeries, m: memory.GpuMemory, e: energy_mod.GpuEnergy) -> GpuReport:
    u = g.column("gpu_util_pct")
    setting = gpu_setting(g)
    # Left out (unset) when the samples do not carry them (agents before protocol field power_limit_w).
    settings = {k: v for k, v in dataclasses.asdict(setting).items() if v is not None}
    return GpuReport.model_validate(jsonable({**settings,
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
    }))
