"""Model FLOPs utilization (MFU): FLOPs per step × steps per second ÷ the GPU's peak FLOP/s for the precision.

FLOPs per step, in order: the hooks' count of one real step (framework_info.flops_per_step, one rank's local batch,
so per GPU); else the estimator's figure for the same model stored with the job (`metadata.estimate`, scaled to the
job's batch size when the estimate was made for another: FLOPs grow linearly with the batch). Steps per second: the
hooks' step count over their summed step time, else 1 / the iteration period found in telemetry. Peak: the GPU
catalogue's dense figure for the precision (fp32 where the format has none). Any of the three unknown: null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetprof.report import MfuSection
from server.analysis.base.gpu_catalog import find_model
from server.analysis.base.jobdata import JobData

_PRECISIONS = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
               "float32": "fp32", "fp32": "fp32", "float": "fp32", "tf32": "fp32"}


def precision_key(precision: str | None) -> str | None:
    if not precision:
        return None
    return _PRECISIONS.get(precision.lower().removeprefix("torch."))


def _flops_per_step(job: JobData) -> tuple[float | None, str | None]:
    fw: Mapping[str, Any] = job.framework or {}
    flops = fw.get("flops_per_step")
    if isinstance(flops, (int, float)) and flops > 0:
        return float(flops), f"hooks:{fw.get('flops_per_step_source') or 'framework_info'}"
    est: Mapping[str, Any] = job.estimate or {}
    flops = est.get("flops_per_step")
    if not isinstance(flops, (int, float)) or flops <= 0:
        return None, None
    est_batch, batch = est.get("batch_size"), job.batch_size
    if isinstance(est_batch, int) and est_batch > 0 and batch is not None and batch != est_batch:
        return float(flops) * batch / est_batch, f"estimate:{est.get('model_name')} scaled from batch {est_batch} " \
                                                f"to {batch}"
    return float(flops), f"estimate:{est.get('model_name')}"


def mfu_section(job: JobData, *, steps: int | None, step_time_mean_s: float | None,
                period_s: float | None) -> MfuSection:
    flops, flops_source = _flops_per_step(job)
    if steps and step_time_mean_s:
        rate, rate_source = 1.0 / step_time_mean_s, "hooks:1 / mean step time"
    elif period_s:
        rate, rate_source = 1.0 / period_s, "telemetry:1 / iteration period"
    else:
        rate, rate_source = None, None
    fw: Mapping[str, Any] = job.framework or {}
    precision = fw.get("precision") or (job.estimate or {}).get("precision")
    key = precision_key(precision if isinstance(precision, str) else None)
    name = next((g.name for g in job.gpus if g.name), None)
    model = find_model(name) if name else None
    peak = model.peak_flops(key) if model is not None and key is not None else None
    achieved = flops * rate if flops is not None and rate is not None else None
    return MfuSection(
        mfu_fraction=achieved / peak if achieved is not None and peak else None,
        achieved_flops_per_s=achieved, flops_per_step=flops, flops_per_step_source=flops_source,
        steps_per_s=rate, steps_per_s_source=rate_source, precision=key,
        peak_flops_per_s=peak, peak_source=f"catalogue:{model.name} {key} dense" if peak and model else None)
