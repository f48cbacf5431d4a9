"""Comparison of runs of one model across GPU types, GPU counts, frameworks and batch sizes.

Pure: each run is the job's metadata plus its characterization report (server.analysis.characterize); every
figure here is read from the report, never recomputed, so a comparison always agrees with the reports it
compares. The first run is the baseline: ratios are `run / baseline` (2.0 = twice the baseline's figure) and
the findings are written relative to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from fleetprof.api_models import CompareOut
from fleetprof.fingerprint import precision_of

GIB = 2**30
# Ratios within this fraction of 1 read as "the same" in the findings (the ratios themselves stay exact).
SAME_FRACTION = 0.05

# (ratio key, row key) for the figures compared against the baseline.
RATIO_FIGURES = (
    ("step_time_ratio", "step_time_p50_s"),
    ("samples_per_s_ratio", "samples_per_s"),
    ("energy_per_sample_ratio", "energy_per_sample_j"),
    ("energy_per_step_ratio", "energy_per_step_j"),
    ("peak_used_ratio", "peak_used_bytes"),
    ("mean_power_ratio", "mean_power_w"),
    ("duration_ratio", "duration_s"),
)
# What may differ between runs of one model: named in the findings and in `differs_from_baseline`.
SETUP_FIELDS = ("gpu_name", "gpu_count", "framework", "batch_size", "precision")


def _get(doc: Mapping[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _gpu_setup(report: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The GPU model (the most common among the job's GPUs) and the GPU count; the requested ones (kept in
    `rightsizing_inputs`) when no telemetry reached the report."""
    gpus = report.get("gpus") or []
    names = Counter(g.get("name") for g in gpus if g.get("name"))
    if gpus:
        return (names.most_common(1)[0][0] if names else None), len(gpus)
    inputs = report.get("rightsizing_inputs") or {}
    return inputs.get("gpu_name"), inputs.get("gpu_count")


# kind -> the run figures it should move, (row key, unit): memory kinds the reserved peak, the rest time and energy.
MEMORY_KINDS = frozenset({"allocator_settings", "memory", "amp_bf16", "batch_size_fit"})
MEMORY_FIGURES = (("peak_reserved_bytes", "bytes"),)
OTHER_FIGURES = (("step_time_p50_s", "s"), ("energy_per_step_j", "J"))


def _realized(kind: str, row: Mapping[str, Any], against: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, unit in MEMORY_FIGURES if kind in MEMORY_KINDS else OTHER_FIGURES:
        before, after = against[key], row[key]
        saving = before - after if before is not None and after is not None else None
        out.append({"figure": key, "unit": unit, "before": before, "after": after, "saving": saving,
                    "saving_pct": 100.0 * saving / before if saving is not None and before > 0 else None,
                    "against_job_id": against["job_id"], "source": f"the runs' reports ({key})"})
    return out


def _applied(row: Mapping[str, Any], applied: Any, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The job's metadata `applied` entries with their realized savings, measured against the job each came from
    when it is among the compared runs, else the baseline. Malformed entries are skipped."""
    by_id = {r["job_id"]: r for r in rows}
    out = []
    for entry in applied if isinstance(applied, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("kind"), str):
            continue
        from_job = entry.get("from_job") if isinstance(entry.get("from_job"), str) else None
        against = by_id.get(from_job, rows[0]) if from_job is not None else rows[0]
        realized = [] if against is row else _realized(entry["kind"], row, against)
        saving = entry.get("predicted_saving")
        out.append({"kind": entry["kind"], "summary": str(entry.get("summary", "")),
                    "from_job": from_job,
                    "setting": entry.get("setting") if isinstance(entry.get("setting"), str) else None,
                    "predicted_saving": saving if isinstance(saving, Mapping) else None, "realized": realized})
    return out


def _applied_finding(job_id: str, item: Mapping[str, Any]) -> str:
    """e.g. "b applied allocator_settings (PYTORCH_CUDA_ALLOC_CONF=...): peak_reserved_bytes 2.0 MiB less than a
    (25.0 %); predicted {'reserved_bytes': ...}"."""
    text = f"{job_id} applied {item['kind']}" + (f" ({item['setting']})" if item["setting"] else "")
    measured = [r for r in item["realized"] if r["saving"] is not None]
    if measured:
        text += ": " + "; ".join(f"{r['figure']} {r['saving']:+.6g} {r['unit']} saved vs {r['against_job_id']}"
                                 + (f" ({r['saving_pct']:.1f} %)" if r["saving_pct"] is not None else "")
                                 for r in measured)
    else:
        text += ": realized saving not measurable (a figure is unknown in one of the runs)"
    if item["predicted_saving"]:
        text += f"; predicted {item['predicted_saving']}"
    return text


def run_precision(report: Mapping[str, Any]) -> str | None:
    """fp32, fp16, bf16, amp_fp16, amp_bf16: the fingerprint section's; for a report without one (hooks before
    fingerprints), the framework section's dtype read by the same rule (autocast's dtype, else the parameters')."""
    found = _get(report, "fingerprint", "precision")
    if found is not None:
        return str(found)
    dtype, source = _get(report, "framework", "precision"), _get(report, "framework", "precision_source")
    if not isinstance(dtype, str):
        return None
    return precision_of(autocast_dtype=dtype if source == "autocast" else None,
                        parameter_dtype=dtype if source != "autocast" else None)


def run_row(job: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """One run's figures. `job`: job_id, name, team, framework, batch_size, state (the job's current metadata);
    `report`: its characterization. Unknown stays None."""
    gpu_name, gpu_count = _gpu_setup(report)
    step = _get(report, "time", "step_time_s") or {}
    energy = report.get("energy") or {}
    memory = report.get("memory") or {}
    return {
        "job_id": job.get("job_id", report.get("job_id")),
        "name": job.get("name", report.get("name")),
        "team": job.get("team", report.get("team")),
        "framework": job.get("framework"),
        "batch_size": job.get("batch_size", report.get("batch_size")),
        "state": job.get("state", report.get("state")),
        "gpu_name": gpu_name,
        "gpu_count": gpu_count,
        "precision": run_precision(report),
        "fingerprint": _get(report, "fingerprint", "fingerprint"),
        "duration_s": report.get("duration_s"),
        "peak_used_bytes": memory.get("peak_used_bytes"),
        "peak_allocated_bytes": memory.get("peak_allocated_bytes"),
        "peak_reserved_bytes": memory.get("peak_reserved_bytes"),
        "memory_total_bytes": memory.get("memory_total_bytes"),
        "gpu_util_mean_pct": _get(report, "utilization", "gpu_mean_pct"),
        "gpu_busy_fraction": _get(report, "time", "gpu_busy_fraction"),
        "steps": _get(report, "time", "steps"),
        "step_time_p50_s": step.get("p50"),
        "step_time_p95_s": step.get("p95"),
        "samples_per_s": _get(report, "time", "samples_per_s"),
        "energy_j": energy.get("energy_j"),
        "energy_source": energy.get("source"),
        "energy_per_step_j": energy.get("energy_per_step_j"),
        "energy_per_sample_j": energy.get("per_sample_j"),
        "mean_power_w": energy.get("mean_power_w"),
        "analyzed_at": report.get("analyzed_at"),
    }


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline; None when either is unknown or the baseline is not positive."""
    if value is None or baseline is None or baseline <= 0:
        return None
    return float(value) / float(baseline)


def _times(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"


def _setup(row: Mapping[str, Any]) -> str:
    parts = [f"{row['gpu_count']}x {row['gpu_name']}" if row["gpu_count"] and row["gpu_name"]
             else (row["gpu_name"] or "unknown GPU")]
    if row["framework"]:
        parts.append(row["framework"])
    if row["batch_size"]:
        parts.append(f"batch {row['batch_size']}")
    if row["precision"]:
        parts.append(str(row["precision"]))
    return ", ".join(parts)


def _speed_phrase(r: float | None, base: str) -> str | None:
    if r is None:
        return None
    if abs(r - 1) <= SAME_FRACTION:
        return f"as fast per step as {base}"
    if r < 1:
        return f"{_times(1 / r)} faster per step than {base}"
    return f"{_times(r)} slower per step than {base}"


def _finding(row: Mapping[str, Any], base: Mapping[str, Any], ratios: Mapping[str, float | None]) -> str:
    """One sentence for a run against the baseline, e.g. "B is 1.80x faster per step than A at 1.30x the
    energy per sample; peak memory 0.75x (30.0 vs 40.0 GiB)"."""
    a, b = base["job_id"], row["job_id"]
    head = _speed_phrase(ratios["step_time_ratio"], a)
    parts: list[str] = []
    if ratios["energy_per_sample_ratio"] is not None:
        parts.append(f"at {_times(ratios['energy_per_sample_ratio'])} the energy per sample")
    elif ratios["energy_per_step_ratio"] is not None:
        parts.append(f"at {_times(ratios['energy_per_step_ratio'])} the energy per step")
    text = f"{b} is {head}" if head else f"{b} has no step time to compare with {a}"
    if parts:
        text += " " + parts[0]
    if ratios["samples_per_s_ratio"] is not None and row["batch_size"] != base["batch_size"]:
        # Steps of different batch sizes do different work: throughput is the fair speed figure then.
        text += f"; throughput {_times(ratios['samples_per_s_ratio'])} in samples/s"
    if ratios["peak_used_ratio"] is not None:
        text += (f"; peak device memory {_times(ratios['peak_used_ratio'])} "
                 f"({row['peak_used_bytes'] / GIB:.1f} vs {base['peak_used_bytes'] / GIB:.1f} GiB)")
    changed = [f for f in SETUP_FIELDS if row[f] != base[f]]
    if changed:
        text += f" [{_setup(row)} vs {_setup(base)}]"
    return text


def _best(rows: Sequence[Mapping[str, Any]], key: str, *, lowest: bool) -> str | None:
    known = [r for r in rows if r[key] is not None]
    if len(known) < 2:
        return None
    pick = min(known, key=lambda r: r[key]) if lowest else max(known, key=lambda r: r[key])
    return pick["job_id"]


def compare_runs(runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> CompareOut:
    """Compare (job metadata, report) pairs; the first is the baseline. A job's `applied` (the recommendations
    `fleetprof run --apply` recorded) comes back per run with the realized saving next to the predicted one.

    Returns `baseline_job_id`, `jobs[]` (run_row figures plus `vs_baseline` ratios and
    `differs_from_baseline`), `best` (which run is fastest per step, has the highest throughput, the least
    energy per sample / per step, the smallest peak memory) and `findings[]` (sentences).
    """
    if not runs:
        raise ValueError("nothing to compare")
    rows = [run_row(job, report) for job, report in runs]
    base = rows[0]
    findings: list[str] = []
    for row in rows:
        ratios = {name: ratio(row[key], base[key]) for name, key in RATIO_FIGURES}
        row["vs_baseline"] = ratios
        row["differs_from_baseline"] = [f for f in SETUP_FIELDS if row[f] != base[f]]
        if row is not base:
            findings.append(_finding(row, base, ratios))
    for (job, _report), row in zip(runs, rows, strict=True):
        row["applied"] = _applied(row, job.get("applied"), rows)
        findings.extend(_applied_finding(row["job_id"], item) for item in row["applied"])
    names = sorted({str(r["name"]) for r in rows if r["name"] is not None})
    fingerprints = {r["fingerprint"] for r in rows if r["fingerprint"] is not None}
    if len(fingerprints) > 1:
        findings.append(f"the runs have {len(fingerprints)} different model fingerprints: they do not train the "
                        "same model (or optimizer)")
    elif len(names) > 1 and not (fingerprints and all(r["fingerprint"] for r in rows)):  # one fingerprint: same model
        findings.append(f"the runs have different names ({', '.join(names)}): check that they train the same model")
    unknown = [r["job_id"] for r in rows if r["step_time_p50_s"] is None]
    if unknown:
        findings.append(f"no framework step times for {', '.join(unknown)} (run under `fleetprof run` with hooks "
                        "to compare time and energy per step)")
    sources = {r["energy_source"] for r in rows if r["energy_j"] is not None}
    if len(sources) > 1:
        findings.append(f"energy comes from different sources ({', '.join(sorted(sources))}): the hardware "
                        "counter is exact, integrated power an estimate")
    best = {
        "fastest_per_step": _best(rows, "step_time_p50_s", lowest=True),
        "highest_throughput": _best(rows, "samples_per_s", lowest=False),
        "least_energy_per_sample": _best(rows, "energy_per_sample_j", lowest=True),
        "least_energy_per_step": _best(rows, "energy_per_step_j", lowest=True),
        "smallest_peak_memory": _best(rows, "peak_used_bytes", lowest=True),
    }
    return CompareOut.model_validate({"baseline_job_id": base["job_id"], "jobs": rows, "best": best,
                                      "findings": findings})
