from __future__ import annotations

import numpy as np

from server.analysis.base.jobdata import GpuSeries, StepSeries
from server.analysis.memory.usage import detect_oom, framework_peaks, gpu_memory

from .realdata import MIB, capture_series, query_gpu_row

GIB = 2**30


def test_real_capture_peak_and_headroom(real_data):
    for path in sorted((real_data / "nvidia-smi").glob("*.txt")):
        g = capture_series(path)
        load = query_gpu_row(path, "load")
        idle = query_gpu_row(path, "idle")
        used = max(float(load["memory.used [MiB]"].split()[0]), float(idle["memory.used [MiB]"].split()[0])) * MIB
        total = float(load["memory.total [MiB]"].split()[0]) * MIB
        m = gpu_memory(g)
        assert m.peak_used_bytes == used
        assert m.headroom_bytes == total - used
        assert m.source == "nvml"
        assert m.pinned_s == 0.0  # none of the captures is near capacity


def test_interval_max_wins_where_present_and_point_sample_elsewhere():
    ts = np.arange(4.0)
    used = np.array([1.0, 5.0, 2.0, 2.0]) * GIB
    used_max = np.array([3.0, np.nan, 2.5, np.nan]) * GIB
    g = GpuSeries("g", None, 8 * GIB, ts, {"memory_used_bytes": used, "memory_used_max_bytes": used_max})
    m = gpu_memory(g)
    assert m.peak_used_bytes == 5 * GIB  # the point sample at t=1 had no interval max
    assert m.source == "nvml_max"
    g2 = GpuSeries("g", None, None, ts, {"memory_used_bytes": np.full(4, np.nan)})
    assert gpu_memory(g2).peak_used_bytes is None and gpu_memory(g2).headroom_bytes is None


def _steps(rank, alloc, resv):
    n = len(rank)
    nan = np.full(n, np.nan)
    return StepSeries(rank=np.array(rank, float), step=np.arange(n, dtype=float), ts=np.arange(n, dtype=float),
                      wall_s=np.ones(n), device_s=nan, samples=nan,
                      allocated_peak_bytes=np.array(alloc, float), reserved_peak_bytes=np.array(resv, float),
                      memory_source="cuda_allocator")


def test_fragmentation_is_per_rank_reserved_minus_allocated():
    s = _steps([0, 0, 1, 1], [4 * GIB, 6 * GIB, 5 * GIB, 5 * GIB], [7 * GIB, 7 * GIB, 9 * GIB, np.nan])
    fw = framework_peaks(s)
    assert fw.peak_allocated_bytes == 6 * GIB
    assert fw.peak_reserved_bytes == 9 * GIB
    assert fw.fragmentation_bytes == 4 * GIB  # rank 1: 9 − 5 (rank 0: 7 − 6 = 1)
    assert abs(fw.fragmentation_fraction - 4 / 9) < 1e-12
    assert fw.source == "cuda_allocator"
    assert framework_peaks(None).fragmentation_bytes is None


def test_oom_from_state_events_and_pinned_memory(real_data):
    h100 = capture_series(real_data / "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    cap = h100.memory_total_bytes
    ts = np.arange(120.0)
    used = np.full(120, 0.5 * cap)
    used[40:80] = 0.99 * cap  # 39 s pinned
    g = gpu_memory(GpuSeries("g", h100.name, cap, ts, {"memory_used_bytes": used}))
    assert g.pinned_s == 39.0
    clean = detect_oom(state="finished", exit_code=0, oom_events=0, gpus=[gpu_memory(h100)])
    assert not clean.detected and not clean.suspected and clean.evidence == []
    pinned = detect_oom(state="finished", exit_code=0, oom_events=0, gpus=[g])
    assert pinned.suspected and not pinned.detected
    failed = detect_oom(state="failed", exit_code=1, oom_events=0, gpus=[g])
    assert failed.detected
    assert detect_oom(state="oom", exit_code=None, oom_events=0, gpus=[]).detected
    assert detect_oom(state="failed", exit_code=1, oom_events=2, gpus=[]).detected


def test_process_memory_separates_the_jobs_processes_from_co_tenants() -> None:
    from server.analysis.base.jobdata import ProcessPeak
    from server.analysis.memory.usage import process_memory

    gib = 2**30
    procs = [ProcessPeak("GPU-0", 100, "j", "env:FLEETPROF_JOB_ID", 30 * gib, 10.0, 50.0),
             ProcessPeak("GPU-1", 101, "j", "env:FLEETPROF_JOB_ID", 31 * gib, 10.0, 50.0),
             ProcessPeak("GPU-0", 200, None, None, 2 * gib, 20.0, 30.0),  # unattributed, e.g. a notebook
             ProcessPeak("GPU-0", 201, "other", "env:SLURM_JOB_ID", 3 * gib, 25.0, 40.0),
             ProcessPeak("GPU-1", 300, None, None, None, 12.0, 13.0)]  # the driver gave no figure
    out = process_memory(procs, "j")
    assert out.process_peak_bytes == 31 * gib
    assert out.job_processes == 2 and out.other_processes == 3
    assert out.other_processes_peak_bytes == 5 * gib  # GPU-0's co-tenants, summed; GPU-1's is unknown
    assert [r.pid for r in out.processes] == [101, 100, 201, 200, 300]  # the job's first, largest first
    # another job's id is not shown (it may be another team's job): it is "another job"
    assert [r.job_id for r in out.processes] == ["j", "j", None, None, None]
    assert [r.whose for r in out.processes] == ["this job", "this job", "another job", "unattributed",
                                                      "unattributed"]


def test_process_memory_unknown_without_process_rows() -> None:
    from server.analysis.base.jobdata import ProcessPeak
    from server.analysis.memory.usage import process_memory

    out = process_memory([], "j")
    assert out.process_peak_bytes is None and out.other_processes_peak_bytes is None
    assert out.job_processes is None and out.processes == []
    only_own = process_memory([ProcessPeak("GPU-0", 1, "j", None, 2**30, 0.0, 1.0)], "j")
    assert only_own.other_processes_peak_bytes == 0  # known: nobody else was there
    unknown = process_memory([ProcessPeak("GPU-0", 1, "j", None, 2**30, 0.0, 1.0),
                              ProcessPeak("GPU-0", 2, None, None, None, 0.0, 1.0)], "j")
    assert unknown.other_processes_peak_bytes is None  # someone was, the driver did not say how much
