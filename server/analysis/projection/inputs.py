"""A job's report (its stored JSON document) or right-sizing record -> the `MeasuredRun` a projection starts from.

Per-GPU figures: the step time is the step's (all ranks step together), power is the mean over the job's GPUs;
the whole job's energy per step is kept for comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from server.analysis.base.gpu_catalog import GpuModel, find_model
from server.analysis.projection.project import MeasuredRun
from server.analysis.projection.shares import StepShares, from_kineto, from_telemetry
from server.analysis.traces.kineto import combine_ranks


class NotEnoughData(ValueError):
    """The job lacks what a projection needs (which GPU it ran on, a step time); the message says what."""


def _mean(values: Sequence[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return float(np.mean(known)) if known else None


def kineto_rows(summaries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Per-rank rows (`combine_ranks`) of these Kineto summaries (`TraceSummary.to_dict()`), each with its
    rank's compute matmul fraction; ValueError when the ranks do not combine."""
    combined = combine_ranks(summaries)
    matmul = {(s.get("rank") if s.get("rank") is not None else 0): s.get("compute_matmul_fraction")
              for s in summaries}
    return [{**r, "compute_matmul_fraction": matmul.get(r["rank"])}
            for r in combined.get("per_rank") or () if r.get("span_us")]


def _kineto_rows(report: Mapping[str, Any],
                 summaries: Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    """Per-rank rows of the job's Kineto traces: combined from the stored per-upload `summaries` when given (they
    carry the compute kernels' matmul fraction, which the report's combined rows do not), else the report's."""
    if summaries:
        try:
            return kineto_rows(summaries)
        except ValueError:  # ranks that do not combine: the report's rows (it says why)
            pass
    kineto = (report.get("traces") or {}).get("kineto") or {}
    return [r for r in kineto.get("per_rank") or () if r.get("span_us")]


def _mean_shares(shares: list[StepShares]) -> StepShares:
    def avg(name: str) -> float:
        return float(np.mean([getattr(s, name) for s in shares]))
    return StepShares(**{k: avg(k) for k in ("compute_bound", "memory_bound", "communication", "idle",
                                             "compute_bound_low", "compute_bound_high")}, basis=shares[0].basis,
                      split_source=shares[0].split_source)


def _gpu(name: str | None, catalog: tuple[GpuModel, ...] | None) -> GpuModel:
    if not name:
        raise NotEnoughData("the job's GPU type is unknown (no telemetry names it and no trace carries it)")
    model = find_model(name, catalog)
    if model is None:
        raise NotEnoughData(f"the job ran on {name!r}, which is not in the GPU catalogue")
    return model


def measured_from_report(report: Mapping[str, Any], *, kineto_summaries: Sequence[Mapping[str, Any]] | None = None,
                         catalog: tuple[GpuModel, ...] | None = None) -> MeasuredRun:
    """`kineto_summaries`: the job's stored per-upload Kineto summaries (`TraceSummary.to_dict()`), for the split
    of compute kernels into GEMM-like and the rest; without them the split's range is the whole compute time.
    Raises `NotEnoughData` when the report names no catalogued GPU or has no step time."""
    gpus = report.get("gpus") or []
    rows = _kineto_rows(report, kineto_summaries)
    trace_gpu = next((((r.get("device") or {}).get("name")) for r in rows if (r.get("device") or {}).get("name")),
                     None)
    named = next((g.get("name") for g in gpus if g.get("name")), None) or trace_gpu \
        or (report.get("rightsizing_inputs") or {}).get("gpu_name")
    gpu = _gpu(named, catalog)
    time = report.get("time") or {}
    step_s = (time.get("step_time_s") or {}).get("mean")
    notes: list[str] = []
    if step_s is None:
        trace_us = _mean([r.get("step_time_mean_us") for r in rows])
        step_s = trace_us / 1e6 if trace_us is not None else None
        if step_s is not None:
            notes.append("step time from the Kineto trace's ProfilerStep spans")
    if step_s is None or step_s <= 0:
        raise NotEnoughData("the job has no step time: run it with the hooks or upload a Kineto trace with "
                            "ProfilerStep spans")
    kineto = [s for s in (from_kineto(r) for r in rows) if s is not None]
    if kineto:
        shares = _mean_shares(kineto)
    else:
        busy = time.get("gpu_busy_fraction")
        if busy is None:
            util = (report.get("utilization") or {}).get("gpu_mean_pct")
            busy = util / 100.0 if util is not None else None
        if busy is None:
            notes.append("no trace and no GPU utilization: the GPU is taken as busy the whole step")
        power = _mean([g.get("mean_power_w") for g in gpus])
        shares = from_telemetry(busy, power / gpu.tdp_w if power is not None else None)
    memory = report.get("memory") or {}
    energy = report.get("energy") or {}
    framework = report.get("framework") or {}
    return MeasuredRun(
        gpu=gpu, step_time_s=float(step_s), shares=shares, precision=framework.get("precision"),
        power_w=_mean([g.get("mean_power_w") for g in gpus]),
        power_limit_w=_mean([g.get("power_limit_w") for g in gpus]),
        energy_per_step_j=energy.get("energy_per_step_j"), gpu_count=max(1, len(gpus) or len(rows)),
        peak_allocated_bytes=memory.get("peak_allocated_bytes"), peak_reserved_bytes=memory.get("peak_reserved_bytes"),
        peak_used_bytes=memory.get("peak_used_bytes"), job_id=report.get("job_id"), notes=tuple(notes))


def measured_from_inputs(inputs: Mapping[str, Any], *,
                         catalog: tuple[GpuModel, ...] | None = None) -> MeasuredRun:
    """From a run's `rightsizing_inputs` (telemetry only: the record keeps no trace breakdown)."""
    gpu = _gpu(inputs.get("gpu_name"), catalog)
    step_s = inputs.get("step_time_s")
    if step_s is None or step_s <= 0:
        raise NotEnoughData("the run has no step time")
    util = inputs.get("gpu_util_mean_pct")
    count = int(inputs.get("gpu_count") or 1)
    per_step = inputs.get("energy_per_step_j")
    power = per_step / step_s / count if per_step is not None else None
    shares = from_telemetry(util / 100.0 if util is not None else None,
                            power / gpu.tdp_w if power is not None else None)
    return MeasuredRun(
        gpu=gpu, step_time_s=float(step_s), shares=shares,
        precision=inputs.get("precision"), power_w=power, power_limit_w=inputs.get("power_limit_w"),
        energy_per_step_j=per_step, gpu_count=count, peak_allocated_bytes=None,
        peak_reserved_bytes=inputs.get("peak_reserved_bytes"), peak_used_bytes=inputs.get("peak_used_bytes"),
        job_id=inputs.get("job_id"))
