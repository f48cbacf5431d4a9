"""A projection calibrated by the fleet's own runs of the same model on both GPU types.

When runs of the job's fingerprint (the same model, optimizer and framework: `fleetprof/fingerprint.py`) have been
measured on the source GPU type and on the target, their ratio says what the datasheets cannot: how this model's
mix of kernels, host work and input pipeline actually moved between the two. The configuration used is the one
nearest the job's in batch size (log distance) among those with the same precision and GPU count that ran on both
types; several at the same distance give their median ratio. The job's step time times that ratio is the central
projection; energy per step likewise, from the configuration's measured energy per step on both types, when both
were measured.

The band is calibrated like the telemetry one: the central ratio x/÷ exp(`FINGERPRINT_BAND_LOG_HALFWIDTH`), a
quantile of |log(projected / measured)| of the step time over Zeus' measured pairs projected this way (each pair
from the same model's other batch sizes; bench/projection.py, `fingerprint_calibrated`, which also scores a
half-width fitted without each model on that model); the energy per step's band likewise.

Pure: the runs are `rightsizing_inputs` records of stored reports (`server.analysis.fleet.rightsizing`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fleetprof.api_models import ProjectionCalibration
from server.analysis.base.gpu_catalog import GpuModel, find_model
from server.analysis.projection.project import normalize_precision

# The 90 % quantile of |log error| of the step time (x/÷1.13) and of the energy per step (x/÷1.16) over Zeus' five
# models' pairs (bench/projection.py, `fingerprint_calibrated.fitted_*`); frozen here. The 90 % quantile, not 80 %:
# a band fitted at 80 % covers less on models it was not fitted on (78 % held out; 87 % at 90 %).
FINGERPRINT_BAND_QUANTILE = 0.9
FINGERPRINT_BAND_LOG_HALFWIDTH = 0.1225
FINGERPRINT_ENERGY_BAND_LOG_HALFWIDTH = 0.1513


def _rule(batch_sizes: list[int | None], sources: int, targets: int, ratio: float, source: str, target: str) -> str:
    batch = ("batch " + " and ".join(str(b) for b in batch_sizes) if batch_sizes != [None]
             else "no batch size recorded")
    return (f"calibrated by this model's runs on both GPU types ({batch}: {sources} run(s) on {source}, {targets} "
            f"on {target}; measured ratio {ratio:.3g}), x/÷{math.exp(FINGERPRINT_BAND_LOG_HALFWIDTH):.2f}: the "
            f"{FINGERPRINT_BAND_QUANTILE:.0%} quantile of |log error| of projections made this way on measured GPU "
            "pairs (Zeus NSDI'23, each from the same model's other batch sizes; bench/projection.py)")


def _catalogue_name(name: Any, catalog: tuple[GpuModel, ...] | None) -> str | None:
    model = find_model(name, catalog) if isinstance(name, str) and name else None
    return model.name if model is not None else None


def _median_known(values: Sequence[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None and v > 0]
    return statistics.median(known) if known else None


def _batch_distance(a: int | None, b: int | None) -> float:
    if a is None or b is None:
        return 0.0 if a == b else math.inf
    return abs(math.log(a / b)) if a > 0 and b > 0 else math.inf


def fingerprint_calibration(job: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], *, source: GpuModel,
                            target: GpuModel, catalog: tuple[GpuModel, ...] | None = None,
                            ) -> ProjectionCalibration | None:
    """`job`: the projected run's `rightsizing_inputs` (its batch size, precision, GPU count); `runs`: the
    fingerprint's runs (the job itself may be among them). None when no configuration ran on both types."""
    precision, count = normalize_precision(job.get("precision")), int(job.get("gpu_count") or 1)
    by_config: dict[int | None, dict[str, list[Mapping[str, Any]]]] = {}
    for run in runs:
        if normalize_precision(run.get("precision")) != precision or int(run.get("gpu_count") or 1) != count:
            continue
        gpu = _catalogue_name(run.get("gpu_name"), catalog)
        if gpu in (source.name, target.name) and (run.get("step_time_s") or 0) > 0:
            by_config.setdefault(run.get("batch_size"), {}).setdefault(gpu, []).append(run)
    both = {b: sides for b, sides in by_config.items() if len(sides) == 2 and source.name != target.name}
    if not both:
        return None
    wanted = job.get("batch_size")
    nearest = min(_batch_distance(b, wanted) for b in both)
    if math.isinf(nearest):
        return None
    chosen = sorted((b for b in both if _batch_distance(b, wanted) == nearest), key=lambda b: (b is None, b))
    time_ratios: list[float] = []
    energy_ratios: list[float] = []
    for b in chosen:
        src, dst = both[b][source.name], both[b][target.name]
        t_s = _median_known([r.get("step_time_s") for r in src])
        t_d = _median_known([r.get("step_time_s") for r in dst])
        if t_s is not None and t_d is not None:
            time_ratios.append(t_d / t_s)
        e_s = _median_known([r.get("energy_per_step_j") for r in src])
        e_d = _median_known([r.get("energy_per_step_j") for r in dst])
        if e_s is not None and e_d is not None:
            energy_ratios.append(e_d / e_s)
    sources = [str(r.get("job_id")) for b in chosen for r in both[b][source.name]]
    targets = [str(r.get("job_id")) for b in chosen for r in both[b][target.name]]
    ratio = statistics.median(time_ratios)
    return ProjectionCalibration(
        source="fingerprint_runs", batch_sizes=chosen, source_job_ids=sources, target_job_ids=targets,
        step_time_ratio=ratio, energy_per_step_ratio=statistics.median(energy_ratios) if energy_ratios else None,
        band_log_halfwidth=FINGERPRINT_BAND_LOG_HALFWIDTH,
        energy_band_log_halfwidth=FINGERPRINT_ENERGY_BAND_LOG_HALFWIDTH,
        rule=_rule(chosen, len(sources), len(targets), ratio, source.name, target.name))
