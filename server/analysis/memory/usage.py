"""Memory characterization: device peaks (NVML), allocator peaks (hooks), headroom, fragmentation, OOM.

Two views of memory that do not agree and should not: NVML sees everything on the device (CUDA context,
cuDNN/cuBLAS workspaces, the caching allocator's whole pool, other processes), the framework hooks see
what PyTorch allocated and reserved. Their difference is itself a finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetprof.report import MemorySection, MemoryTimeline, ProcessMemory
from server.analysis.base.downsample import downsample
from server.analysis.base.jobdata import GpuSeries, JobData, ProcessPeak, StepSeries, jsonable, nanmax_or_none

# NVML "used" at or above this share of capacity counts as pinned at capacity: the allocator has run out
# of room to grow, which is how an OOM looks from the outside when the framework reports nothing.
PINNED_FRACTION = 0.98
# How long memory must stay pinned before we call it an OOM symptom rather than a transient peak.
PINNED_MIN_S = 30.0


@dataclass
class GpuMemory:
    uuid: str
    memory_total_bytes: int | None
    peak_used_bytes: int | None
    headroom_bytes: int | None
    peak_used_fraction: float | None
    pinned_s: float  # longest stretch at >= PINNED_FRACTION of capacity
    source: str | None  # "nvml_max" (interval maxima) or "nvml" (point samples)


@dataclass
class OomFinding:
    detected: bool
    suspected: bool
    evidence: list[str] = field(default_factory=list)


def gpu_capacity_bytes(gpu: GpuSeries) -> int | None:
    """Capacity from the GPU's static info, else the largest `memory_total_bytes` sample."""
    if gpu.memory_total_bytes:
        return int(gpu.memory_total_bytes)
    v = nanmax_or_none(gpu.column("memory_total_bytes"))
    return int(v) if v else None


def used_peak_series(gpu: GpuSeries) -> np.ndarray:
    """Per-sample peak used bytes: the interval maximum where the agent sent one, else the point sample.

    fmax ignores a NaN on either side, so a sample with only one of the two still counts.
    """
    return np.fmax(gpu.column("memory_used_max_bytes"), gpu.column("memory_used_bytes"))


def _longest_run_s(ts: np.ndarray, mask: np.ndarray) -> float:
    """Longest time span of consecutive samples where `mask` holds (first to last sample of the run)."""
    if not mask.any():
        return 0.0
    m = mask.astype(np.int8)
    edges = np.diff(np.concatenate([[0], m, [0]]))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return float(np.max(ts[ends] - ts[starts]))


def gpu_memory(gpu: GpuSeries) -> GpuMemory:
    capacity = gpu_capacity_bytes(gpu)
    series = used_peak_series(gpu)
    peak = nanmax_or_none(series)
    source = None
    if peak is not None:
        source = "nvml_max" if gpu.has("memory_used_max_bytes") else "nvml"
    headroom = capacity - int(peak) if (capacity is not None and peak is not None) else None
    pinned_s = 0.0
    if capacity and peak is not None:
        with np.errstate(invalid="ignore"):
            pinned = series >= PINNED_FRACTION * capacity
        pinned_s = _longest_run_s(gpu.ts, pinned)
    return GpuMemory(
        uuid=gpu.uuid,
        memory_total_bytes=capacity,
        peak_used_bytes=None if peak is None else int(peak),
        headroom_bytes=headroom,
        peak_used_fraction=(peak / capacity) if (capacity and peak is not None) else None,
        pinned_s=pinned_s,
        source=source,
    )


@dataclass(frozen=True)
class FrameworkPeaks:
    """The framework allocator's figures (None: unknown, e.g. no hooks)."""

    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    fragmentation_bytes: int | None = None
    fragmentation_fraction: float | None = None
    source: str | None = None  # what the hooks said measured them ("cuda_allocator", ...), else "framework"


def framework_peaks(steps: StepSeries | None) -> FrameworkPeaks:
    """Allocator peaks from hook steps and the cache the allocator held beyond its peak allocation.

    fragmentation_bytes = max over ranks of (peak reserved − peak allocated) on that rank: the pool the
    caching allocator kept but could not (or did not) hand out at the job's high-water mark. It is an upper
    bound on external fragmentation; splitting internal from external needs an allocator snapshot.
    """
    if steps is None or len(steps) == 0:
        return FrameworkPeaks()
    alloc = np.asarray(steps.allocated_peak_bytes, dtype=np.float64)
    resv = np.asarray(steps.reserved_peak_bytes, dtype=np.float64)
    peak_allocated = _opt_int(nanmax_or_none(alloc))
    peak_reserved = _opt_int(nanmax_or_none(resv))
    source = steps.memory_source or "framework" if peak_allocated is not None or peak_reserved is not None else None
    ranks = np.asarray(steps.rank)
    best_frag: float | None = None
    best_resv: float | None = None
    for r in np.unique(ranks):
        sel = ranks == r
        a, v = nanmax_or_none(alloc[sel]), nanmax_or_none(resv[sel])
        if a is None or v is None:
            continue
        frag = max(v - a, 0.0)
        if best_frag is None or frag > best_frag:
            best_frag, best_resv = frag, v
    return FrameworkPeaks(
        peak_allocated_bytes=peak_allocated, peak_reserved_bytes=peak_reserved,
        fragmentation_bytes=None if best_frag is None else int(best_frag),
        fragmentation_fraction=best_frag / best_resv if best_frag is not None and best_resv else None,
        source=source)


def detect_oom(*, state: str | None, exit_code: int | None, oom_events: int,
               gpus: list[GpuMemory]) -> OomFinding:
    """OOM from what the job told us (state, allocator OOM events), or suspected from memory pinned at
    capacity for PINNED_MIN_S. Exit code alone is not proof: 137 is any SIGKILL (host OOM killer, scancel)."""
    evidence: list[str] = []
    detected = False
    if state == "oom":
        detected = True
        evidence.append("job ended with state 'oom'")
    if oom_events > 0:
        detected = True
        evidence.append(f"{oom_events} allocator out-of-memory event(s) reported by the framework hook")
    suspected = False
    for g in gpus:
        if g.pinned_s >= PINNED_MIN_S:
            suspected = True
            evidence.append(
                f"GPU {g.uuid} memory stayed at >= {PINNED_FRACTION:.0%} of capacity for {g.pinned_s:.0f} s")
    if exit_code is not None and exit_code != 0 and suspected:
        evidence.append(f"job exited with code {exit_code} while memory was pinned at capacity")
        detected = True
    return OomFinding(detected=detected, suspected=suspected and not detected, evidence=evidence)


def memory_timeline(gpus: list[GpuSeries], n_points: int = 200) -> list[MemoryTimeline]:
    """Per-GPU used-memory timeline for the report, min/max downsampled so peaks survive (NaN: unknown, None)."""
    out = []
    for g in gpus:
        t_d, v_d = downsample(g.ts, used_peak_series(g), n_points)
        out.append(MemoryTimeline.model_validate(jsonable({"uuid": g.uuid, "ts": t_d, "used_bytes": v_d})))
    return out


MAX_PROCESS_ROWS = 64  # the report lists this many processes, largest first; the figures count them all


@dataclass(frozen=True)
class ProcessFigures:
    process_peak_bytes: int | None
    job_processes: int | None
    other_processes: int | None
    other_processes_peak_bytes: int | None
    processes: list[ProcessMemory]


def process_memory(processes: list[ProcessPeak], job_id: str) -> ProcessFigures:
    """Per-process device memory (NVML) on the job's GPUs: the job's own processes (one per rank, usually) and
    the others that shared its GPUs while it ran (other jobs', or unattributed), whose memory it could not use.

    `process_peak_bytes` is the largest peak of one of the job's processes; `other_processes_peak_bytes` the
    largest, over the job's GPUs, of the summed peaks of other processes on one GPU (an upper bound: they may
    not have peaked together)."""
    own = [p for p in processes if p.job_id == job_id]
    others = [p for p in processes if p.job_id != job_id]
    own_peaks = [p.peak_used_bytes for p in own if p.peak_used_bytes is not None]
    per_gpu: dict[str, int] = {}
    for p in others:
        if p.peak_used_bytes is not None:
            per_gpu[p.gpu_uuid] = per_gpu.get(p.gpu_uuid, 0) + p.peak_used_bytes
    rows = sorted(processes, key=lambda p: (p.job_id != job_id, -(p.peak_used_bytes or 0), p.gpu_uuid, p.pid))
    return ProcessFigures(
        process_peak_bytes=max(own_peaks) if own_peaks else None,
        job_processes=len({(p.gpu_uuid, p.pid) for p in own}) if processes else None,
        other_processes=len({(p.gpu_uuid, p.pid) for p in others}) if processes else None,
        # 0 only when there were no others; others whose memory the driver did not give leave it unknown
        other_processes_peak_bytes=max(per_gpu.values()) if per_gpu else (0 if processes and not others else None),
        # whose: "this job", "another job" or "unattributed" (nobody could tell, e.g. pids of another container's
        # namespace); job_id only when it is this job's: another job may be another team's (issue 15).
        processes=[ProcessMemory.model_validate(jsonable({
            "pid": p.pid, "gpu_uuid": p.gpu_uuid, "peak_used_bytes": p.peak_used_bytes,
            "job_id": p.job_id if p.job_id == job_id else None, "whose": _whose(p.job_id, job_id),
            "attribution": p.attribution, "first_seen": p.first_ts, "last_seen": p.last_ts}))
            for p in rows[:MAX_PROCESS_ROWS]],
    )


def _whose(process_job_id: str | None, job_id: str) -> str:
    if process_job_id is None:
        return "unattributed"
    return "this job" if process_job_id == job_id else "another job"


def _opt_int(v: float | None) -> int | None:
    return None if v is None else int(v)


def largest_peak(gpus: list[GpuMemory]) -> GpuMemory | None:
    """The GPU with the largest known NVML peak: the job-level peak is what must fit on one device."""
    peaks = [m for m in gpus if m.peak_used_bytes is not None]
    return max(peaks, key=lambda m: m.peak_used_bytes or 0) if peaks else None


def memory_section(job: JobData, gpus: list[GpuMemory], fw: FrameworkPeaks) -> MemorySection:
    """The job's memory: `gpus` from `gpu_memory` (one per job GPU), `fw` from `framework_peaks`."""
    top = largest_peak(gpus)
    headrooms = [m.headroom_bytes for m in gpus if m.headroom_bytes is not None]
    oom = detect_oom(state=job.state, exit_code=job.exit_code, oom_events=job.oom_events, gpus=gpus)
    procs = process_memory(job.processes, job.job_id)
    return MemorySection.model_validate(jsonable({
        "peak_used_bytes": top.peak_used_bytes if top else None,
        "peak_used_gpu": top.uuid if top else None,
        "peak_allocated_bytes": fw.peak_allocated_bytes,
        "peak_reserved_bytes": fw.peak_reserved_bytes,
        # The tightest GPU: what is left on the device closest to running out.
        "headroom_bytes": min(headrooms) if headrooms else None,
        "fragmentation_bytes": fw.fragmentation_bytes,
        "fragmentation_fraction": fw.fragmentation_fraction,
        "memory_total_bytes": top.memory_total_bytes if top else None,
        # Device memory the framework does not account for: CUDA context, library workspaces, others.
        "non_framework_bytes": (top.peak_used_bytes - fw.peak_reserved_bytes)
        if (top and top.peak_used_bytes is not None and fw.peak_reserved_bytes is not None) else None,
        "oom_detected": oom.detected,
        "oom_suspected": oom.suspected,
        "oom_evidence": oom.evidence,
        "process_peak_bytes": procs.process_peak_bytes,
        "job_processes": procs.job_processes,
        "other_processes": procs.other_processes,
        "other_processes_peak_bytes": procs.other_processes_peak_bytes,
        "processes": procs.processes,
        "timeline": memory_timeline(job.gpus),
    }))
