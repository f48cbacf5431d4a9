"""Benchmark: characterize() on a synthetic 24 h × 8 GPU × 1 Hz job (≈ 691,000 samples) with hook steps.

Run: .venv/bin/python bench/characterize.py [--hours 24] [--gpus 8] [--repeat 3]
Prints a table: samples, steps, build time, best/median characterize time. The data is synthetic (a
periodic training load with noise, a counter reset, an idle tail) because only timing is measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_report  # noqa: E402
from server.analysis.base.jobdata import GpuSeries, JobData, StepSeries  # noqa: E402
from server.analysis.characterize import characterize  # noqa: E402
from server.analysis.health.findings import health_section  # noqa: E402
from server.analysis.time.gpu_stragglers import nvml_stragglers  # noqa: E402

GIB = 2**30


def synthetic_job(hours: float = 24.0, n_gpus: int = 8, hz: float = 1.0, step_s: float = 0.8,
                  seed: int = 0) -> JobData:
    rng = np.random.default_rng(seed)
    t0 = 1_700_000_000.0
    n = int(hours * 3600 * hz)
    ts = t0 + np.arange(n) / hz
    period_s = 6.0  # e.g. an eval/checkpoint cycle visible at 1 Hz
    phase = (ts - t0) % period_s / period_s
    busy = np.where(phase < 0.7, 1.0, 0.3)
    gpus = []
    for i in range(n_gpus):
        util = np.clip(95 * busy + rng.normal(0, 3, n), 0, 100)
        util[-600:] = 0.0  # idle tail: the job finished, the GPU stayed held
        power = 80 + 320 * util / 100 + rng.normal(0, 5, n)
        counter = np.cumsum(power / hz) + 1e6 * i
        counter[n // 2:] -= counter[n // 2]  # a driver reload resets the counter
        used = 60 * GIB + 2 * GIB * busy + rng.normal(0, 0.1 * GIB, n)
        # clock-event reasons (idle bit in the tail; GPU 3 thermally throttled for 2 h), clocks, temperature
        hot = (i == 3) & (ts >= t0 + 3600) & (ts < t0 + 3 * 3600)
        reasons = np.where(hot, 0x20, np.where(util < 5, 0x1, 0)).astype(np.float64)
        cols = {"gpu_util_pct": util, "mem_util_pct": util * 0.4, "power_w": power,
                "energy_counter_j": counter, "memory_used_bytes": used, "memory_used_max_bytes": used + 0.2 * GIB,
                "throttle_reasons": reasons, "sm_clock_mhz": np.where(hot, 1400.0, 1980.0),
                "temperature_c": np.where(hot, 88.0, 65.0)}
        gpus.append(GpuSeries(uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", memory_total_bytes=85520809984,
                              ts=ts, columns=cols, power_source="nvmlDeviceGetPowerUsage"))
    n_steps = int(hours * 3600 / step_s)
    rank = np.repeat(np.arange(n_gpus), n_steps).astype(np.float64)
    step = np.tile(np.arange(n_steps), n_gpus).astype(np.float64)
    wall = step_s * (1 + rng.normal(0, 0.02, rank.size))
    wall[step < 5] *= 4  # warm-up
    steps = StepSeries(rank=rank, step=step, ts=t0 + step * step_s, wall_s=wall, device_s=wall * 0.9,
                       samples=np.full(rank.size, 32.0), allocated_peak_bytes=np.full(rank.size, 50.0 * GIB),
                       reserved_peak_bytes=np.full(rank.size, 58.0 * GIB), memory_source="cuda_allocator")
    return JobData(job_id="bench-24h", state="finished", name="bench", team="perf", started_at=t0,
                   ended_at=float(ts[-1]), exit_code=0, batch_size=32, gpu_type_requested="H100-80GB",
                   gpus_requested=n_gpus, gpus=gpus, steps=steps, layers=[])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    t = time.perf_counter()
    job = synthetic_job(args.hours, args.gpus)
    build_s = time.perf_counter() - t
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        report = characterize(job, now=float(job.ended_at or 0) + 60)
        times.append(time.perf_counter() - t)
    size = len(json.dumps(report))
    t = time.perf_counter()
    health = health_section(job.gpus)
    health_s = time.perf_counter() - t
    t = time.perf_counter()
    nvml_stragglers(job.gpus, report["time"]["period_s"])
    stragglers_s = time.perf_counter() - t
    rows = [
        ("gpus", args.gpus), ("samples", sum(g.ts.size for g in job.gpus)),
        ("step rows", len(job.steps) if job.steps else 0), ("build_s", f"{build_s:.2f}"),
        ("characterize best_s", f"{min(times):.3f}"), ("characterize median_s", f"{statistics.median(times):.3f}"),
        ("report_json_bytes", size), ("period_s", report["time"]["period_s"]),
        ("energy_source", report["energy"]["source"]),
        ("of which health_s", f"{health_s:.3f}"), ("of which nvml_stragglers_s", f"{stragglers_s:.3f}"),
        ("health findings", len(health.findings)),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    write_report(__file__, {
        "gpus_count": args.gpus, "samples_count": sum(g.ts.size for g in job.gpus),
        "step_rows_count": len(job.steps) if job.steps else 0, "build_s": build_s,
        "characterize_best_s": min(times), "characterize_median_s": statistics.median(times),
        "report_json_bytes": size, "period_s": report["time"]["period_s"],
        "energy_source": report["energy"]["source"], "health_s": health_s, "nvml_stragglers_s": stragglers_s,
        "health_findings_count": len(health.findings)})


if __name__ == "__main__":
    main()
