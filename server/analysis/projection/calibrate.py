"""A projection calibrated by what the fleet measured on both GPU types: the same model's runs, else other models'.

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

Without such runs of the job's model, other models' runs measured on both types still say how far the datasheet
roofline misses between these two GPUs (`FleetPairs`): for each configuration (fingerprint, batch size,
precision, GPU count) that ran on both, the measured target/source step-time ratio against the ratio the roofline
projects from its source run (`project`, telemetry basis); the median of measured / projected over them (at least
`FLEET_MIN_MODELS` models) multiplies the job's own roofline ratio. Its band: `FLEET_BAND_LOG_HALFWIDTH`, the 90 %
quantile of |log error| on Zeus' pairs with each model corrected by the other models' pairs only (bench/projection.py,
`fleet_pairs`).

Pure: the runs are `rightsizing_inputs` records of stored reports (`server.analysis.fleet.rightsizing`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fleetprof.api_models import ProjectionCalibration
from server.analysis.base.gpu_catalog import GpuModel, find_model
from server.analysis.projection.inputs import NotEnoughData, measured_from_inputs
from server.analysis.projection.project import MeasuredRun, normalize_precision, roofline_step_ratio

# The 90 % quantile of |log error| of the step time (x/÷1.13) and of the energy per step (x/÷1.16) over Zeus' five
# models' pairs (bench/projection.py, `fingerprint_calibrated.fitted_*`); frozen here. The 90 % quantile, not 80 %:
# a band fitted at 80 % covers less on models it was not fitted on (78 % held out; 87 % at 90 %).
FINGERPRINT_BAND_QUANTILE = 0.9
FINGERPRINT_BAND_LOG_HALFWIDTH = 0.1225
FINGERPRINT_ENERGY_BAND_LOG_HALFWIDTH = 0.1513
# Other models' pairs: at least this many models (one model's miss is a poor guide to another's), and the band
# (bench/projection.py, `fleet_pairs.fitted_band_log_halfwidth_ratio`; frozen here).
FLEET_MIN_MODELS = 2
FLEET_BAND_LOG_HALFWIDTH = 0.6473
LISTED_JOB_IDS = 50


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
        source="fingerprint_runs", batch_sizes=chosen, source_job_ids=sources[:LISTED_JOB_IDS],
        target_job_ids=targets[:LISTED_JOB_IDS], models=1, pairs=len(chosen),
        step_time_ratio=ratio, energy_per_step_ratio=statistics.median(energy_ratios) if energy_ratios else None,
        band_log_halfwidth=FINGERPRINT_BAND_LOG_HALFWIDTH,
        energy_band_log_halfwidth=FINGERPRINT_ENERGY_BAND_LOG_HALFWIDTH,
        rule=_rule(chosen, len(sources), len(targets), ratio, source.name, target.name))


class FleetPairs:
    """The fleet's runs grouped once by configuration (fingerprint, batch size, precision, GPU count) and GPU type,
    to calibrate projections between any two types (`calibration`)."""

    def __init__(self, runs: Sequence[tuple[str, Mapping[str, Any]]], *,
                 catalog: tuple[GpuModel, ...] | None = None) -> None:
        """`runs`: (fingerprint, `rightsizing_inputs`) of the fleet's runs."""
        self._catalog = catalog
        self._runs: dict[tuple[Any, ...], tuple[MeasuredRun, float] | None] = {}
        self._answers: dict[tuple[str, str], ProjectionCalibration | None] = {}
        names: dict[Any, str | None] = {}
        self._groups: dict[tuple[Any, ...], dict[str, list[Mapping[str, Any]]]] = {}
        for fingerprint, run in runs:
            raw = run.get("gpu_name")
            gpu = names[raw] if raw in names else names.setdefault(raw, _catalogue_name(raw, catalog))
            if gpu is not None and (run.get("step_time_s") or 0) > 0:
                key = (fingerprint, run.get("batch_size"), normalize_precision(run.get("precision")),
                       int(run.get("gpu_count") or 1))
                self._groups.setdefault(key, {}).setdefault(gpu, []).append(run)

    def _measured(self, key: tuple[Any, ...], gpu: str) -> tuple[MeasuredRun, float] | None:
        """(the run nearest the configuration's median step time on `gpu`, as a measured run; that median),
        built once per configuration and type; None when the run lacks what a projection needs."""
        memo = (key, gpu)
        if memo not in self._runs:
            runs = self._groups[key][gpu]
            median = statistics.median(float(r["step_time_s"]) for r in runs)
            representative = min(runs, key=lambda r: abs(float(r["step_time_s"]) - median))
            try:
                self._runs[memo] = (measured_from_inputs(representative, catalog=self._catalog), median)
            except NotEnoughData:
                self._runs[memo] = None
        return self._runs[memo]

    def calibration(self, source: GpuModel, target: GpuModel) -> ProjectionCalibration | None:
        """None when fewer than FLEET_MIN_MODELS models ran one configuration on both types. Answered once per pair
        of types (the object is kept while its runs stand: server/jobs/projection.py)."""
        key = (source.name, target.name)
        if key not in self._answers:
            self._answers[key] = self._calibration(source, target)
        return self._answers[key]

    def _calibration(self, source: GpuModel, target: GpuModel) -> ProjectionCalibration | None:
        if source.name == target.name:
            return None
        residuals: list[float] = []
        models: set[str] = set()
        sources: list[str] = []
        targets: list[str] = []
        for key, sides in self._groups.items():
            src, dst = sides.get(source.name), sides.get(target.name)
            if not src or not dst:
                continue
            measured = self._measured(key, source.name)
            if measured is None:
                continue
            run, t_s = measured
            t_d = statistics.median(float(r["step_time_s"]) for r in dst)
            residuals.append(math.log(t_d / t_s / roofline_step_ratio(run, target)))
            models.add(key[0])
            sources += [str(r.get("job_id")) for r in src]
            targets += [str(r.get("job_id")) for r in dst]
        if len(models) < FLEET_MIN_MODELS:
            return None
        correction = math.exp(statistics.median(residuals))
        rule = (f"the roofline x{correction:.3g}: the median measured / projected step-time ratio of "
                f"{len(residuals)} configuration(s) of {len(models)} other model(s) measured on both {source.name} "
                f"and {target.name}; x/÷{math.exp(FLEET_BAND_LOG_HALFWIDTH):.2f}, the "
                f"{FINGERPRINT_BAND_QUANTILE:.0%} quantile of |log error| on measured GPU pairs with each model "
                "corrected by the others' only (Zeus NSDI'23; bench/projection.py)")
        return ProjectionCalibration(
            source="fleet_pairs", batch_sizes=[], source_job_ids=sources[:LISTED_JOB_IDS],
            target_job_ids=targets[:LISTED_JOB_IDS], step_time_ratio=None, energy_per_step_ratio=None,
            roofline_correction=correction, models=len(models), pairs=len(residuals),
            band_log_halfwidth=FLEET_BAND_LOG_HALFWIDTH, energy_band_log_halfwidth=None, rule=rule)

