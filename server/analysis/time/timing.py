"""Time: step-time distribution from hook steps, GPU busy fraction from NVML, the per-layer table."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetprof.report import InputStalls, LayerRow, StepTime, Stragglers, TimeSection
from server.analysis.base.jobdata import GpuSeries, JobData, LayerStat, StepSeries, jsonable
from server.analysis.time import gpu_stragglers, iterations

# Warm-up: leading steps (cuDNN autotuning, allocator growth, compilation) slower than this multiple of
# the median are excluded from the distribution, but never more than WARMUP_MAX_FRACTION of the steps.
WARMUP_SLOW_FACTOR = 1.5
WARMUP_MAX_STEPS = 50
WARMUP_MAX_FRACTION = 0.1


def step_times(steps: StepSeries) -> tuple[np.ndarray, np.ndarray]:
    """(step index, step wall time) with one value per step: the slowest rank's, since a synchronous
    data-parallel step ends when its last rank does."""
    step = np.asarray(steps.step, dtype=np.float64)
    wall = np.asarray(steps.wall_s, dtype=np.float64)
    ok = ~np.isnan(step) & ~np.isnan(wall)
    step, wall = step[ok], wall[ok]
    if step.size == 0:
        return step, wall
    uniq, inv = np.unique(step, return_inverse=True)
    worst = np.full(uniq.shape, -np.inf)
    np.maximum.at(worst, inv, wall)
    return uniq, worst


def warmup_count(wall_s: np.ndarray) -> int:
    """Number of leading steps that are warm-up: the leading run slower than WARMUP_SLOW_FACTOR × median."""
    n = wall_s.size
    if n < 5:
        return 0
    limit = min(WARMUP_MAX_STEPS, int(n * WARMUP_MAX_FRACTION))
    med = float(np.median(wall_s))
    slow = wall_s[:limit] > WARMUP_SLOW_FACTOR * med
    # Leading run of slow steps only: a slow step later on is a real outlier, not warm-up.
    not_slow = np.flatnonzero(~slow)
    return int(not_slow[0]) if not_slow.size else int(limit)


@dataclass(frozen=True)
class StepStats:
    """The hook steps' figures of the time section (None: unknown, e.g. no hooks)."""

    steps: int | None = None
    step_time_s: StepTime = field(default_factory=lambda: StepTime(mean=None, p50=None, p95=None, p99=None))
    warmup_steps_excluded: int = 0
    samples: int | None = None
    samples_per_s: float | None = None
    device_time_fraction: float | None = None


def step_stats(steps: StepSeries | None) -> StepStats:
    if steps is None or len(steps) == 0:
        return StepStats()
    idx, wall = step_times(steps)
    k = 0
    step_time = StepStats().step_time_s
    if wall.size:
        k = warmup_count(wall)
        w = wall[k:]
        step_time = StepTime(mean=float(np.mean(w)), p50=float(np.percentile(w, 50)),
                             p95=float(np.percentile(w, 95)), p99=float(np.percentile(w, 99)))
    samples, samples_per_s = None, None
    per_row = np.asarray(steps.samples, dtype=np.float64)
    if per_row.size and not np.all(np.isnan(per_row)):
        # Each rank reports its local batch: the job processed the sum over (rank, step) rows.
        samples = int(np.nansum(per_row))
        total_wall = float(np.sum(wall)) if wall.size else 0.0
        samples_per_s = samples / total_wall if total_wall > 0 else None
    device_time_fraction = None
    dev = np.asarray(steps.device_s, dtype=np.float64)
    wl = np.asarray(steps.wall_s, dtype=np.float64)
    both = ~np.isnan(dev) & ~np.isnan(wl)
    if both.any() and float(np.sum(wl[both])) > 0:
        device_time_fraction = float(np.sum(dev[both]) / np.sum(wl[both]))
    return StepStats(steps=int(idx.size), step_time_s=step_time, warmup_steps_excluded=k, samples=samples,
                     samples_per_s=samples_per_s, device_time_fraction=device_time_fraction)


@dataclass(frozen=True)
class BusyShare:
    gpu_busy_fraction: float | None
    gpu_active_sample_fraction: float | None


def busy_fraction(gpus: list[GpuSeries]) -> BusyShare:
    """GPU busy fraction = mean NVML utilization.gpu / 100 over all samples of all GPUs.

    NVML defines utilization.gpu as the share of the sample period during which at least one kernel ran,
    so its mean is the share of time the GPUs were busy. The share of samples with any activity
    (util > 0) is reported beside it: it overstates a GPU that runs a tiny kernel every period.
    """
    utils = [g.column("gpu_util_pct") for g in gpus]
    u = np.concatenate(utils) if utils else np.empty(0)
    u = u[~np.isnan(u)]
    if u.size == 0:
        return BusyShare(gpu_busy_fraction=None, gpu_active_sample_fraction=None)
    return BusyShare(gpu_busy_fraction=float(np.mean(u) / 100.0), gpu_active_sample_fraction=float(np.mean(u > 0)))


def layer_table(layers: list[LayerStat], step_s: float | None = None, top: int = 50) -> list[LayerRow]:
    """Per-module time (mean per sampled step, as loaded), sorted by total time, with shares OF THE STEP.

    `step_s` is the mean wall time of the steps the layers were sampled in. `time_fraction` is a module's inclusive
    time (its children's included: the root module spans ~the whole step) over `step_s`; `self_time_s` and
    `self_time_fraction` leave out the time of its children in the table. Shares summed to a total over nested
    modules before, which counted each time once per enclosing module: the root of a model showed 24.5 %.
    Unknown step time gives null shares, never a share of something else.
    """
    agg: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "module_type": None, "forward_s": None, "backward_s": None, "activation_bytes": None, "calls": 0})
    for ls in layers:
        a = agg[ls.module]
        a["module_type"] = a["module_type"] or ls.module_type
        if ls.forward_s is not None:
            a["forward_s"] = (a["forward_s"] or 0.0) + ls.forward_s
        if ls.backward_s is not None:
            a["backward_s"] = (a["backward_s"] or 0.0) + ls.backward_s
        if ls.activation_bytes is not None:
            # Activations of one call are live together; across steps they are not: keep the largest.
            a["activation_bytes"] = max(a["activation_bytes"] or 0, ls.activation_bytes)
        a["calls"] += ls.calls
    rows: dict[str, dict[str, Any]] = {}
    for module, a in agg.items():
        times = [t for t in (a["forward_s"], a["backward_s"]) if t is not None]
        rows[module] = {"module": module, **a, "total_s": sum(times) if times else None}
    parents = module_parents({m: r["module_type"] for m, r in rows.items()},
                             {m: r["total_s"] or 0.0 for m, r in rows.items()})
    children_s: dict[str, float] = defaultdict(float)
    for module, parent in parents.items():
        if parent is not None:
            children_s[parent] += rows[module]["total_s"] or 0.0
    step = step_s if step_s is not None and step_s > 0 else None
    for module, r in rows.items():
        total = r["total_s"]
        own = None if total is None else max(0.0, total - children_s[module])
        r["parent"] = parents[module]
        r["self_time_s"] = own
        r["time_fraction"] = total / step if step is not None and total is not None else None
        r["self_time_fraction"] = own / step if step is not None and own is not None else None
    ordered = sorted(rows.values(), key=lambda r: -(r["total_s"] or 0.0))
    return [LayerRow.model_validate(jsonable(r)) for r in ordered[:top]]


def module_parents(types: dict[str, str | None], totals: dict[str, float]) -> dict[str, str | None]:
    """Each module's nearest enclosing module in the table, from the hooks' names: dotted paths from the model
    (`layer1.0.conv1` is in `layer1.0`); the model itself is named after its type (`ResNet`), and modules called
    outside it (a loss) after their type too (`CrossEntropyLoss`, `CrossEntropyLoss#2`). Of the undotted names equal
    to their type, the longest-running is taken as the model, the parent of the undotted attribute names."""
    roots = [m for m in types if "." not in m and m == types[m]]
    root = max(roots, key=lambda m: totals.get(m, 0.0)) if roots else None
    parents: dict[str, str | None] = {}
    for module in types:
        parts = module.split(".")
        parent = next((p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if p in types), None)
        if parent is None and module not in roots and "#" not in module:
            parent = root
        parents[module] = parent
    return parents


def time_section(job: JobData) -> TimeSection:
    """The job's time: hook steps, the iteration period from telemetry (and whether the hooks agree), GPU busy
    share, input stalls, stragglers across ranks, GPU imbalance, per-layer time."""
    st = step_stats(job.steps)
    busy = busy_fraction(job.gpus)
    period = iterations.telemetry_period(job.gpus)
    check = iterations.cross_check(period.period_s if period else None, iterations.hook_period_s(job.steps))
    stragglers = _stragglers(job, period.period_s if period else None)
    imbalance = iterations.gpu_imbalance(job.gpus)
    return TimeSection.model_validate(jsonable({
        "steps": st.steps,
        "step_time_s": st.step_time_s,
        "warmup_steps_excluded": st.warmup_steps_excluded,
        "samples": st.samples,
        "samples_per_s": st.samples_per_s,
        "device_time_fraction": st.device_time_fraction,
        "period_s": period.period_s if period else None,
        "period_confidence": period.confidence if period else None,
        "period_signal": period.signal if period else None,
        "hook_period_s": check.hook_period_s,
        "agrees_with_hooks": check.agrees_with_hooks,
        "steps_per_period": check.steps_per_period,
        "gpu_busy_fraction": busy.gpu_busy_fraction,
        "gpu_active_sample_fraction": busy.gpu_active_sample_fraction,
        "input_stalls": _stalls(job.gpus),
        "stragglers": stragglers,
        "gpu_util_spread_pct": imbalance.gpu_util_spread_pct,
        "least_busy_gpu": imbalance.least_busy_gpu,
        "layers": layer_table(job.layers, job.layer_step_s),
        "layers_step_time_s": job.layer_step_s,
        "trace_summaries": job.trace_summaries,
    }))


def _stalls(gpus: list[GpuSeries]) -> InputStalls:
    """Input stalls on the busiest-looking GPU with utilization (one GPU: DP ranks stall together)."""
    with_util = [g for g in gpus if g.has("gpu_util_pct")]
    if not with_util:
        return iterations.input_stalls(np.empty(0), np.empty(0))
    g = with_util[0]
    return iterations.input_stalls(g.ts, g.column("gpu_util_pct"))


def _stragglers(job: JobData, period_s: float | None) -> Stragglers | None:
    """Ranks from the hooks' step times, GPUs from NVML alone (gpu_uuid entries); null when neither can tell."""
    by_rank = (iterations.rank_stragglers(job.steps.rank, job.steps.wall_s)
               if job.steps is not None and len(job.steps) else None)
    compared = [g for g in job.gpus if g.ts.size and g.has("gpu_util_pct")]
    by_gpu = gpu_stragglers.nvml_stragglers(compared, period_s)
    if by_rank is None and len(compared) < 2:
        return None
    if by_rank is None:
        return Stragglers(ranks=None, median_step_s=period_s, stragglers=by_gpu, gpus=len(compared), source="nvml")
    if len(compared) < 2:
        return by_rank.model_copy(update={"source": "hooks"})
    return by_rank.model_copy(update={"stragglers": [*by_rank.stragglers, *by_gpu], "gpus": len(compared),
                                      "source": "hooks+nvml"})
