"""A measured step projected onto another GPU: the roofline calibrated with what the run achieved.

Each category of the measured step (`shares.StepShares`) scales by its own ratio of the two GPUs' datasheet
figures (`server/analysis/base/gpu_catalog.json`): compute-bound time by the peak FLOP/s ratio at the run's
precision, memory-bound time by the memory bandwidth ratio, communication by the host link (PCIe) ratio at the
band's ends and 1 at the centre (the interconnect is not in the catalogue), idle time (host, input pipeline) not at
all: the same host feeds the target. What the run achieved (its time per category, its power against the power
model) is the calibration: the projection moves each part of the measurement, it never starts from peak figures.

The band, from a trace (kineto basis): the ends of the compute-bound share's range and of the communication ratio
(the structural band), widened by `MODEL_ERROR_FRACTION` either way for what datasheet ratios miss (architectures
reach different fractions of their peaks). From telemetry alone: calibrated, the central ratio times
exp(+-`TELEMETRY_BAND_LOG_HALFWIDTH`), the `TELEMETRY_BAND_QUANTILE` quantile of |log(projected / measured)| over
the fit models' pairs (bench/projection.py measures it there and reports coverage on models held out of the fit).
The answer's `band_source` says which.

Power: the power rule (`server.analysis.energy.power_model`) gives the share of TDP for the step's mix on each
GPU; a measured mean power calibrates it (measured / modelled on the source, applied to the target's model).
Energy per step = power x time, its band the product of the ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product

from fleetprof.api_models import Band, ProjectedCategory, ProjectedMemory, ProjectionCalibration, ProjectionOut
from server.analysis.base.gpu_catalog import GpuModel
from server.analysis.energy.power_model import WAITING_POWER_FRACTION, power_fraction
from server.analysis.projection.shares import StepShares

# What datasheet ratios miss, either way (a factor 1.15 on the structural band's ends). Set a priori at the
# validation target's size (15 %), not fitted: bench/projection.py reports the coverage it gives.
MODEL_ERROR_FRACTION = 0.15
# Telemetry basis: the band's half-width in log space (x/÷1.68), the TELEMETRY_BAND_QUANTILE quantile of |log error|
# of the step time over Zeus' five models' GPU pairs (bench/projection.py, `product_constants`); frozen here. Its
# coverage on unseen models: `leave_one_model_out` (each model scored by a half-width fitted without it).
TELEMETRY_BAND_QUANTILE = 0.8
TELEMETRY_BAND_LOG_HALFWIDTH = 0.5186
# Band on the power fraction, in shares of the target's TDP: calibrated by a measured power, or the model alone
# (the estimator's band, server/estimate/service.py).
POWER_BAND_MEASURED = 0.10
POWER_BAND_MODEL = 0.15
MIB = 2**20


@dataclass(frozen=True)
class MeasuredRun:
    """What a run measured, per GPU. `power_w`: its mean draw while stepping; `power_limit_w`: the limit it ran
    under (None: the GPU's TDP; the projection notes a capped source, the target runs at its TDP)."""

    gpu: GpuModel
    step_time_s: float
    shares: StepShares
    precision: str | None = None  # "fp32" | "fp16" | "bf16"; None: fp32
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_per_step_j: float | None = None  # the whole job's (all its GPUs)
    gpu_count: int = 1
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_used_bytes: int | None = None  # NVML's device peak: the allocator's plus the CUDA context and others
    job_id: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def normalize_precision(precision: str | None) -> str:
    """'torch.bfloat16', 'bf16', 'float16', 'half', 'float32', None -> 'bf16' | 'fp16' | 'fp32'."""
    p = (precision or "").lower()
    if "bf16" in p or "bfloat16" in p:
        return "bf16"
    if "fp16" in p or "float16" in p or "half" in p:
        return "fp16"
    return "fp32"


def target_precision(precision: str, dst: GpuModel) -> str:
    """The format the run would use on `dst`: bf16 where it has no bf16 is run in fp16 (a port keeps 16-bit
    tensor cores); a format with no tensor-core figure at all falls back to fp32 (`GpuModel.peak_flops`)."""
    if precision == "bf16" and dst.peak_bf16_tflops is None and dst.peak_fp16_tflops is not None:
        return "fp16"
    return precision


def _ratio_rules(src: GpuModel, dst: GpuModel, precision: str) -> dict[str, tuple[float, float, float, str]]:
    """Per category: (central, low, high, rule) of target time / source time."""
    dst_precision = target_precision(precision, dst)
    f_s, f_d = src.peak_flops(precision), dst.peak_flops(dst_precision)
    b_s, b_d = src.mem_bandwidth_bytes_per_s, dst.mem_bandwidth_bytes_per_s
    link = src.pcie_bandwidth_bytes_per_s / dst.pcie_bandwidth_bytes_per_s
    r_c, r_m = f_s / f_d, b_s / b_d
    return {
        "compute_bound": (r_c, r_c, r_c, f"peak FLOP/s: {f_s / 1e12:g} ({precision}) / {f_d / 1e12:g} "
                                         f"({dst_precision}) TFLOPS"),
        "memory_bound": (r_m, r_m, r_m, f"memory bandwidth: {b_s / 1e9:g} / {b_d / 1e9:g} GB/s"),
        "communication": (1.0, min(1.0, link), max(1.0, link),
                          f"unchanged at the centre (interconnect not in the catalogue); host link "
                          f"{src.pcie_bandwidth_bytes_per_s / 1e9:g} / {dst.pcie_bandwidth_bytes_per_s / 1e9:g} GB/s "
                          "at the band's ends"),
        "idle": (1.0, 1.0, 1.0, "unchanged: the same host and input pipeline feed the target"),
    }


def _time_factor(s: StepShares, cb: float, r_c: float, r_m: float, comm_ratio: float) -> float:
    """Target step / source step with `cb` of the step compute-bound (the rest of the GPU's work memory-bound)."""
    mb = s.compute_bound + s.memory_bound - cb
    return cb * r_c + mb * r_m + s.communication * comm_ratio + s.idle


def roofline_step_ratio(run: MeasuredRun, target: GpuModel) -> float:
    """The central target/source step-time ratio of the datasheet roofline alone (`project`'s before any
    calibration), without building the whole answer."""
    precision = normalize_precision(run.precision)
    f_s, f_d = run.gpu.peak_flops(precision), target.peak_flops(target_precision(precision, target))
    r_m = run.gpu.mem_bandwidth_bytes_per_s / target.mem_bandwidth_bytes_per_s
    return _time_factor(run.shares, run.shares.compute_bound, f_s / f_d, r_m, 1.0)


def _modelled_power_fraction(s: StepShares, r_c: float, r_m: float) -> tuple[float, float]:
    """(source, target) power fractions of TDP by the power rule for this step's mix before and after scaling."""
    def frac(cb_t: float, mb_t: float) -> float:
        busy_t = cb_t + mb_t + s.communication
        total = busy_t + s.idle
        return power_fraction(cb_t / busy_t if busy_t else 0.0, busy_t / total if total else 0.0)
    return frac(s.compute_bound, s.memory_bound), frac(s.compute_bound * r_c, s.memory_bound * r_m)


def _band(central: float, low: float, high: float, lo_clip: float = 0.0, hi_clip: float | None = None) -> Band:
    low, high = max(lo_clip, min(low, central)), max(high, central)
    if hi_clip is not None:
        high, central = min(high, hi_clip), min(central, hi_clip)
    return Band(central=central, low=low, high=high)


def project(run: MeasuredRun, target: GpuModel, *, telemetry_band_log_halfwidth: float | None = None,
            calibration: ProjectionCalibration | None = None) -> ProjectionOut:
    """`telemetry_band_log_halfwidth`: the frozen `TELEMETRY_BAND_LOG_HALFWIDTH` unless given (the bench's folds).
    `calibration`: this model's runs measured on both GPU types (`calibrate.fingerprint_calibration`): its ratios
    stand in for the datasheets' in the step time and, where it measured energy on both, the energy per step."""
    s = run.shares
    precision = normalize_precision(run.precision)
    rules = _ratio_rules(run.gpu, target, precision)
    r_c, r_m = rules["compute_bound"][0], rules["memory_bound"][0]
    central = _time_factor(s, s.compute_bound, r_c, r_m, 1.0)
    corners = [_time_factor(s, cb, r_c, r_m, comm)
               for cb, comm in product((s.compute_bound_low, s.compute_bound_high),
                                       (rules["communication"][1], rules["communication"][2]))]
    err = 1.0 + MODEL_ERROR_FRACTION
    if calibration is not None:
        spread = math.exp(calibration.band_log_halfwidth)
        c = (calibration.step_time_ratio if calibration.step_time_ratio is not None
             else central * (calibration.roofline_correction or 1.0))
        ratio = _band(c, c / spread, c * spread)
        band_source = calibration.rule
    elif s.basis == "telemetry":
        spread = math.exp(TELEMETRY_BAND_LOG_HALFWIDTH if telemetry_band_log_halfwidth is None
                          else telemetry_band_log_halfwidth)
        ratio = _band(central, central / spread, central * spread)
        band_source = (f"calibrated: x/÷{spread:.2f}, the {TELEMETRY_BAND_QUANTILE:.0%} quantile of |log error| of "
                       "the step time over measured GPU pairs (Zeus NSDI'23, 5 models, 4 GPUs; bench/projection.py, "
                       "which reports its coverage on models held out of the fit)")
    else:
        ratio = _band(central, min(corners) / err, max(corners) * err)
        band_source = (f"structural: the compute-bound share's range and the communication ratio's ends, "
                       f"x{err:g} for what datasheet ratios miss (set a priori)")
    t = run.step_time_s
    step = Band(central=t * ratio.central, low=t * ratio.low, high=t * ratio.high)
    notes = list(run.notes)

    model_s, model_d = _modelled_power_fraction(s, r_c, r_m)
    if run.power_w is not None and model_s > 0:
        # the rule's unit is the share of TDP, whatever limit the run had: a capped run's draw divided by its cap
        # reads as near 1 and projected the target at its TDP (Zeus' runs under 60 % of their limit: energy off by
        # 111 % that way, 38 % this way; bench/projection.py)
        achieved = (run.power_w / run.gpu.tdp_w) / model_s
        pf = min(1.0, max(WAITING_POWER_FRACTION, model_d * achieved))
        power_source, half = "measured, scaled by the power model", POWER_BAND_MEASURED
        if run.power_limit_w is not None and run.power_limit_w < run.gpu.tdp_w:
            notes.append(f"the run was capped at {run.power_limit_w:g} W (TDP {run.gpu.tdp_w:g} W): the target is "
                         "projected at its TDP, and a capped run's clocks understate the source's speed")
    else:
        pf, power_source, half = model_d, "power model", POWER_BAND_MODEL
    tdp = target.tdp_w
    power = _band(tdp * pf, tdp * (pf - half), tdp * (pf + half), hi_clip=tdp)
    n = run.gpu_count
    energy = Band(central=power.central * step.central * n, low=power.low * step.low * n,
                  high=power.high * step.high * n)
    if (calibration is not None and calibration.energy_per_step_ratio is not None and run.energy_per_step_j
            and calibration.energy_band_log_halfwidth is not None):
        e = run.energy_per_step_j * calibration.energy_per_step_ratio
        spread = math.exp(calibration.energy_band_log_halfwidth)
        energy = Band(central=e, low=e / spread, high=e * spread)
        per_gpu_w = e / step.central / n
        power = _band(per_gpu_w, per_gpu_w / spread, per_gpu_w * spread, hi_clip=tdp)
        power_source = "measured: the energy per step of this model's runs on both GPU types (calibration)"

    def cost(gpu: GpuModel, seconds: float) -> float | None:
        return gpu.price_per_hour_usd * seconds / 3600.0 * n if gpu.price_per_hour_usd is not None else None

    cost_band = (Band(central=cost(target, step.central) or 0.0, low=cost(target, step.low) or 0.0,
                      high=cost(target, step.high) or 0.0) if target.price_per_hour_usd is not None else None)
    if target_precision(precision, target) != precision:
        notes.append(f"{target.name} has no {precision} tensor cores: projected as run in "
                     f"{target_precision(precision, target)}")
    categories = [
        ProjectedCategory.model_validate({"category": name, "measured_fraction": getattr(s, name), "ratio": c,
                                          "ratio_low": lo, "ratio_high": hi, "rule": rule})
        for name, (c, lo, hi, rule) in rules.items()
    ]
    band_rule = (f"{band_source}; coverage on held-out models measured by bench/projection.py"
                 if s.basis == "telemetry" or calibration is not None else
                 f"the compute-bound share's range ({s.compute_bound_low:.2f}-{s.compute_bound_high:.2f} of the "
                 f"step) and the communication ratio's ends, widened x{err:g} for what datasheet ratios miss; "
                 "coverage measured by bench/projection.py")
    return ProjectionOut(
        job_id=run.job_id, source_gpu=run.gpu.name, target_gpu=target.name, basis=s.basis,  # type: ignore[arg-type]
        measured_step_time_s=t, step_time_s=step, step_time_ratio=ratio,
        measured_power_w=run.power_w, power_w=power, power_source=power_source,
        measured_energy_per_step_j=run.energy_per_step_j, energy_per_step_j=energy,
        cost_per_step_usd=cost_band, measured_cost_per_step_usd=cost(run.gpu, t),
        memory=project_memory(run, target), categories=categories, band_rule=band_rule, notes=notes,
        band_source=band_source, split_source=s.split_source, calibration=calibration)


def project_memory(run: MeasuredRun, target: GpuModel) -> ProjectedMemory:
    peak = run.peak_reserved_bytes if run.peak_reserved_bytes is not None else run.peak_allocated_bytes
    from_nvml = peak is None and run.peak_used_bytes is not None
    if from_nvml and run.peak_used_bytes is not None:
        # NVML's peak holds the source's context: swap it for the target's
        peak = max(0, run.peak_used_bytes - run.gpu.cuda_context_bytes)
    required = peak + target.cuda_context_bytes if peak is not None else None
    changes = [
        f"CUDA context and library workspaces: {run.gpu.cuda_context_bytes / MIB:.0f} MiB on {run.gpu.name} -> "
        f"{target.cuda_context_bytes / MIB:.0f} MiB on {target.name} (catalogue)",
        "allocator peaks carried over: the same framework, model, batch size and precision allocate the same "
        "tensors; cuBLAS/cuDNN may pick other algorithms (and workspaces) on another architecture",
    ]
    if from_nvml:
        changes.append("no allocator peak: NVML's device peak less the source's context stands for it (it also "
                       "holds other processes' memory on that GPU)")
    elif peak is None:
        changes.append("no allocator peak measured: whether it fits is unknown")
    elif run.peak_reserved_bytes is None:
        changes.append("only the allocated peak is known: the caching allocator reserves more than that")
    fits = required <= target.memory_bytes if required is not None else None
    return ProjectedMemory(
        peak_allocated_bytes=run.peak_allocated_bytes, peak_reserved_bytes=run.peak_reserved_bytes,
        source_context_bytes=run.gpu.cuda_context_bytes, target_context_bytes=target.cuda_context_bytes,
        required_bytes=required, target_capacity_bytes=target.memory_bytes, fits=fits,
        headroom_bytes=target.memory_bytes - required if required is not None else None, changes=changes)
