"""Characterization of one model across configurations (issue #21): the runs of a fingerprint, or chosen runs,
by GPU type, GPU count, batch size, precision and framework.

Pure: each run is the job's metadata plus its characterization report (as in `compare`, whose `run_row` gives the
figures the two share, so both answers agree with the reports). A configuration is one value on every axis; its
figures are the medians over its runs that know them. A finding compares two configurations that differ in
exactly one axis ("amp_bf16 vs fp32 (precision) on 1x A100, batch 64, pytorch 2.13: 1.70x the throughput
(samples/s), 0.55x the energy per sample (J/sample)"); the `from` side is the baseline of that axis (fp32 for
precision, the smaller batch size or GPU count, the first name otherwise).

Cost per step is the GPU rental price of the catalogue (`price_per_hour_usd`, server/analysis/base) times the GPU
count times the step time, and null without a price. MFU needs the FLOPs of a step: read from the estimate stored
with the job (`metadata.estimate`, `fleetprof estimate --local --job-id`) when there is one, else null.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from fleetprof.api_models import CharacterizationOut, ConfigurationAxis
from server.analysis.base.gpu_catalog import GpuModel, find_model
from server.analysis.compare import run_row

AXES: Final[tuple[ConfigurationAxis, ...]] = ("gpu_type", "gpu_count", "batch_size", "precision", "framework")
# (figure, unit, words) compared in findings, in the order they are written.
FINDING_FIGURES: Final = (
    ("samples_per_s", "samples/s", "the throughput"),
    ("step_time_s", "s", "the step time"),
    ("energy_per_sample_j", "J/sample", "the energy per sample"),
    ("energy_per_step_j", "J/step", "the energy per step"),
    ("peak_memory_bytes", "bytes", "the peak memory"),
    ("cost_per_step_usd", "USD/step", "the cost per step"),
    ("mfu_fraction", "fraction", "the MFU"),
)
FIGURES: Final = ("step_time_s", "samples_per_s", "peak_memory_bytes", "memory_total_bytes", "headroom_bytes",
                  "energy_per_step_j", "energy_per_sample_j", "cost_per_step_usd", "energy_cost_per_step_usd",
                  "gpu_util_mean_pct", "mfu_fraction")
INT_FIGURES: Final = frozenset({"peak_memory_bytes", "memory_total_bytes", "headroom_bytes"})
FINDING_AXES: Final[tuple[ConfigurationAxis, ...]] = ("precision", "gpu_type", "gpu_count", "batch_size", "framework")
PRECISION_ORDER: Final = ("fp32", "fp64", "bf16", "fp16", "amp_bf16", "amp_fp16", "other")
MAX_FINDINGS: Final = 60
J_PER_KWH: Final = 3.6e6

GpuLookup = Callable[[str], GpuModel | None]


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _framework(job: Mapping[str, Any], report: Mapping[str, Any]) -> str | None:
    fp = report.get("fingerprint") or {}
    if fp.get("framework"):
        version = fp.get("framework_version")
        return f"{fp['framework']} {version}" if version else str(fp["framework"])
    return job.get("framework")  # the job_start event's "pytorch 2.x"


def _mfu(job: Mapping[str, Any], row: Mapping[str, Any], gpu: GpuModel | None,
         precision: str | None) -> tuple[float | None, str | None]:
    """FLOPs per step per GPU from the job's stored estimate (scaled from its batch size to the run's) over the
    step time and the GPU's catalogue peak at the run's precision."""
    est = _get(job, "metadata", "estimate")
    flops, est_batch = _get(est, "flops_per_step"), _get(est, "batch_size")
    step, batch = row["step_time_p50_s"], row["batch_size"]
    if gpu is None or not isinstance(flops, int | float) or not isinstance(est_batch, int) or est_batch <= 0 \
            or not step or not batch:
        return None, None
    peak = gpu.peak_flops({"amp_bf16": "bf16", "bf16": "bf16", "amp_fp16": "fp16", "fp16": "fp16"}.get(
        precision or "fp32", "fp32"))
    return (float(flops) * batch / est_batch / step / peak,
            f"metadata.estimate.flops_per_step x batch {batch}/{est_batch} / step time / {gpu.name} peak")


def characterize_run(job: Mapping[str, Any], report: Mapping[str, Any], *,
                     lookup: GpuLookup = find_model) -> dict[str, Any]:
    """One run's configuration and figures (`ConfigurationRun` fields)."""
    row = run_row(job, report)
    cpu = not report.get("gpus") and _get(report, "framework", "device") == "cpu"
    gpu_type, gpu_count = ("cpu", 0) if cpu else (row["gpu_name"], row["gpu_count"])
    gpu = lookup(gpu_type) if gpu_type and not cpu else None
    memory = report.get("memory") or {}
    if row["peak_used_bytes"] is not None:
        peak, total = row["peak_used_bytes"], memory.get("memory_total_bytes")
    else:  # no NVML (a CPU run): the hooks' peak (process RSS on CPU) against the device's or host's memory
        peak, total = memory.get("peak_reserved_bytes"), _get(report, "framework", "device_memory_total_bytes")
    headroom = memory.get("headroom_bytes") if row["peak_used_bytes"] is not None else (
        total - peak if total is not None and peak is not None else None)
    step = row["step_time_p50_s"]
    price = gpu.price_per_hour_usd if gpu is not None else None
    energy = report.get("energy") or {}
    per_step_j = row["energy_per_step_j"]
    energy_cost = (per_step_j / J_PER_KWH * energy["pue"] * energy["price_per_kwh_usd"]
                   if per_step_j is not None and energy.get("pue") is not None
                   and energy.get("price_per_kwh_usd") is not None else None)
    precision = row["precision"]
    mfu, mfu_source = _mfu(job, row, gpu, precision)
    return {
        "job_id": row["job_id"], "name": row["name"], "state": row["state"],
        "gpu_type": gpu_type, "gpu_count": gpu_count, "batch_size": row["batch_size"], "precision": precision,
        "framework": _framework(job, report),
        "step_time_s": step, "samples_per_s": row["samples_per_s"], "peak_memory_bytes": peak,
        "memory_total_bytes": total, "headroom_bytes": headroom, "energy_per_step_j": per_step_j,
        "energy_per_sample_j": row["energy_per_sample_j"], "energy_source": row["energy_source"],
        "cost_per_step_usd": (price * gpu_count * step / 3600.0
                              if price is not None and gpu_count and step is not None else None),
        "energy_cost_per_step_usd": energy_cost, "gpu_util_mean_pct": row["gpu_util_mean_pct"],
        "mfu_fraction": mfu, "mfu_source": mfu_source,
    }


def _median(values: Sequence[Any], integer: bool) -> float | int | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    m = statistics.median(known)
    return int(round(m)) if integer else float(m)


def _configurations(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault(tuple(run[a] for a in AXES), []).append(run)
    out = []
    for key, members in groups.items():
        conf: dict[str, Any] = dict(zip(AXES, key, strict=True))
        conf.update({f: _median([m[f] for m in members], f in INT_FIGURES) for f in FIGURES})
        conf["runs"], conf["job_ids"] = len(members), [m["job_id"] for m in members]
        out.append(conf)
    out.sort(key=lambda c: tuple(_order(a, c[a]) for a in AXES))
    return out


def _order(axis: str, value: Any) -> tuple[int, Any]:
    """Sort key of an axis value: the axis' baseline first, unknown last."""
    if value is None:
        return (2, "")
    if axis == "precision":
        return (0, PRECISION_ORDER.index(value) if value in PRECISION_ORDER else len(PRECISION_ORDER))
    if axis in ("gpu_count", "batch_size"):
        return (0, value)
    return (1 if value == "cpu" else 0, str(value))


def _show(axis: str, value: Any) -> str:
    if value is None:
        return "unknown"
    return f"batch {value}" if axis == "batch_size" else f"{value} GPUs" if axis == "gpu_count" else str(value)


def _times(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"


def _context(same: Mapping[str, Any]) -> str:
    """The shared axes in words: "1x A100-80GB, batch 64, fp32, pytorch 2.13.0"."""
    gpu_type, count = same.get("gpu_type"), same.get("gpu_count")
    parts = []
    if gpu_type is not None and count:
        parts.append(f"{count}x {gpu_type}")
    elif gpu_type is not None or count is not None:
        parts.append(_show("gpu_type", gpu_type) if gpu_type is not None else _show("gpu_count", count))
    parts += [_show(ax, same[ax]) for ax in ("batch_size", "precision", "framework")
              if ax in same and same[ax] is not None]
    return ", ".join(parts)


def _finding(axis: ConfigurationAxis, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any] | None:
    ratios: list[dict[str, Any]] = []
    for figure, unit, _words in FINDING_FIGURES:
        base, value = a[figure], b[figure]
        if base is not None and value is not None and base > 0:
            ratios.append({"figure": figure, "unit": unit, "baseline": float(base), "value": float(value),
                           "ratio": float(value) / float(base)})
    if not ratios:
        return None
    same: dict[str, Any] = {ax: a[ax] for ax in AXES if ax != axis}
    context = _context(same)
    words = {f: w for f, _u, w in FINDING_FIGURES}
    said = ", ".join(f"{_times(r['ratio'])} {words[r['figure']]} ({r['unit']})" for r in ratios)
    summary = f"{_show(axis, b[axis])} vs {_show(axis, a[axis])} ({axis}) on the same {context or 'setup'}: {said}"
    return {"axis": axis, "from_value": _show(axis, a[axis]), "to_value": _show(axis, b[axis]), "same": same,
            "ratios": ratios, "summary": summary}


def findings(configurations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every pair of configurations that differ in exactly one known axis, baseline first (at most MAX_FINDINGS,
    precision and GPU type first: the comparisons the issue asks for)."""
    out = []
    for axis in FINDING_AXES:
        for a, b in itertools.combinations(configurations, 2):
            if a[axis] is None or b[axis] is None or a[axis] == b[axis]:
                continue
            if any(a[o] != b[o] for o in AXES if o != axis):
                continue
            lo, hi = (a, b) if _order(axis, a[axis]) <= _order(axis, b[axis]) else (b, a)
            found = _finding(axis, lo, hi)
            if found is not None:
                out.append(found)
    return out[:MAX_FINDINGS]


def characterize_configurations(runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], *,
                                fingerprint: str | None, runs_total: int | None = None,
                                lookup: GpuLookup = find_model) -> CharacterizationOut:
    """(job metadata, report) pairs, newest first -> the characterization. Job metadata: job_id, name, state,
    framework, batch_size, metadata (the job's, for a stored estimate)."""
    rows = [characterize_run(job, report, lookup=lookup) for job, report in runs]
    confs = _configurations(rows)
    fps = {_get(report, "fingerprint", "fingerprint") for _job, report in runs}
    if fingerprint is None and len(fps) == 1:
        fingerprint = next(iter(fps))
    notes = []
    if len(fps - {None}) > 1 or (None in fps and len(fps) > 1):
        notes.append(f"the runs carry {len(fps)} different fingerprints (or none): they may not train the same "
                     "model")
    unknown = [r["job_id"] for r in rows if r["step_time_s"] is None]
    if unknown:
        notes.append(f"no step time for {', '.join(unknown[:10])}: run under `fleetprof run` with hooks")
    if any(r["cost_per_step_usd"] is None and r["gpu_type"] not in (None, "cpu") for r in rows):
        notes.append("cost per step is null where the GPU catalogue has no price_per_hour_usd for the GPU")
    if len(rows) < (runs_total or 0):
        notes.append(f"the newest {len(rows)} of {runs_total} runs")
    first = next((report.get("fingerprint") for _job, report in runs if report.get("fingerprint")), None) or {}
    return CharacterizationOut.model_validate({
        "fingerprint": fingerprint, "model_class": first.get("model_class"),
        "parameter_count": first.get("parameter_count"),
        "runs_total": runs_total if runs_total is not None else len(rows), "runs": rows,
        "configurations": confs, "axes_varied": [a for a in AXES if len({r[a] for r in rows}) > 1],
        "findings": findings(confs), "notes": notes})
