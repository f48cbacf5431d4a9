"""Summaries of PyTorch profiler (Kineto) traces, streamed in one pass and bounded memory.

One pass over `traceEvents` (via `traces.reader`) keeps only compact numeric columns: one row per GPU
activity (start, duration, correlation id, category) and per CPU-side launch (start, correlation id),
per-kernel-name totals, `ProfilerStep#N` spans and `[memory]` samples. No event dict outlives its
turn in the loop.

The GPU time breakdown follows HolisticTraceAnalysis' temporal breakdown
(`hta.analyzers.breakdown_analysis.get_temporal_breakdown`, HTA 0.5) so the two agree:
- GPU activities are events with an integer `args.stream` other than -1 (kernels, memcpy, memset);
  events without `dur` or `cat`, and the `Trace` span, are not events;
- when a trace holds more than one distinct `ProfilerStep` name, the last step is incomplete: only
  activities launched (by correlation id) by a CPU event starting before the last `ProfilerStep`
  began are counted;
- span = last activity end - first activity start; busy = length of the union of activities;
  idle = span - busy; compute = union of compute kernels (names that are not NCCL kernels, not
  Memcpy/Memset, not *Sync); non-compute = busy - compute;
- sub-microsecond timestamps (float `ts`) are rounded as HTA does: start up, end down.
We split non-compute further into communication (NCCL), memcpy, memset and other, each counted only
where no higher category (compute > communication > memcpy > memset > other) is running, so the
categories plus idle add up to the span.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from server.analysis.base.downsample import minmax_indices
from server.analysis.base.jobdata import jsonable
from server.analysis.traces.reader import TraceFormatError, TraceTooLargeError, iter_events, open_trace, read_header
from server.analysis.traces.tf_trace import ScopeTime, TfTraceReader

__all__ = [
    "DeviceInfo",
    "GpuTimeBreakdown",
    "KernelStat",
    "MemoryTimeline",
    "StepTime",
    "TraceFormatError",
    "TraceSummary",
    "TraceTooLargeError",
    "combine_ranks",
    "summarize_trace",
]

log = logging.getLogger(__name__)

TOP_KERNELS = 20
MEMORY_POINTS_MAX = 1000  # per device, after downsampling (peaks kept)
KINETO_CUDA_DEVICE_TYPE = 1  # `[memory]` `Device Type`: 0 = CPU, 1 = CUDA

# HTA's kernel classes (hta/utils/utils.py), kept verbatim so our compute time is theirs.
_NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_KERNEL_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})  # on the GPU but stream -1 (HTA)
_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Compute kernels that run at the GPU's FLOP/s roof rather than its memory bandwidth: GEMMs and convolutions
# (cuBLAS/cutlass/cuDNN names: sgemm, s1688gemm, xmma, implicit_convolve, wgrad/dgrad ...) and fused attention.
_MATMUL_KERNEL_RE = re.compile(r"gemm|conv(?:olution|olve|[123]d|_)|cudnn|cutlass|cublas|xmma|wgrad|dgrad|fprop|"
                               r"winograd|hmma|imma|s1688|s884|h1688|h884|flash|fmha|attention|_nn$|_nt$|_tn$|_tt$",
                               re.IGNORECASE)

# Category codes, in priority order for the exclusive split.
COMPUTE, COMMUNICATION, MEMCPY, MEMSET, OTHER = range(5)
CATEGORY_NAMES = ("compute", "communication", "memcpy", "memset", "other")


def is_matmul_kernel(name: str) -> bool:
    """A GEMM, convolution or fused-attention kernel (compute-bound at its roof), by name."""
    return _MATMUL_KERNEL_RE.search(name) is not None


def kernel_category(name: str) -> int:
    """compute / communication (NCCL) / memcpy / memset / other, by name as HTA classifies kernels."""
    if _NCCL_KERNEL_RE.match(name):
        return COMMUNICATION
    if _MEMORY_KERNEL_RE.match(name):
        return MEMSET if name.startswith("Memset") else MEMCPY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTE
    return OTHER


# ------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class DeviceInfo:
    device_id: int
    name: str | None
    memory_total_bytes: int | None
    compute_capability: str | None
    sm_count: int | None


@dataclass(frozen=True)
class GpuTimeBreakdown:
    """Time on one rank's GPU over HTA's span (microseconds; `_pct` of span)."""

    span_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    communication_us: float
    memcpy_us: float
    memset_us: float
    other_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    communication_pct: float
    memcpy_pct: float
    memset_pct: float
    other_pct: float
    activities: int  # GPU activities inside the window
    last_step_excluded: bool  # HTA's rule: the last ProfilerStep is incomplete


@dataclass(frozen=True)
class KernelStat:
    name: str
    category: str
    count: int
    total_us: float
    mean_us: float
    max_us: float


@dataclass(frozen=True)
class StepTime:
    step: int
    start_us: float  # trace clock
    duration_us: float


@dataclass(frozen=True)
class MemoryTimeline:
    """Allocator memory of one device over time, downsampled to at most MEMORY_POINTS_MAX points.

    `source`: "total_allocated" (Kineto's own `Total Allocated`/`Total Reserved`) or "bytes_delta"
    (2021 traces carry only `Bytes`: the running sum is rebuilt, shifted so it never goes below zero;
    it is then a lower bound, blind to memory allocated before profiling began, and reserved is unknown).
    """

    device: str  # "cuda:0", "cpu"
    source: str
    samples: int
    ts_us: list[float]
    allocated_bytes: list[int]
    reserved_bytes: list[int] | None
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None


@dataclass(frozen=True)
class TraceSummary:
    rank: int | None
    world_size: int | None
    distributed_backend: str | None
    device: DeviceInfo | None  # the GPU this rank's kernels ran on
    devices_listed: int  # entries of `deviceProperties`
    trace_bytes: int  # decompressed JSON size
    gpu_time: GpuTimeBreakdown | None  # None: no GPU activity in the trace
    top_kernels: list[KernelStat]
    steps: list[StepTime]
    memory: list[MemoryTimeline]
    peak_allocated_bytes: int | None  # largest over GPU devices (None: no GPU memory events)
    peak_reserved_bytes: int | None
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)
    # Of the compute kernels' summed time, the share in GEMM/convolution/attention kernels (`is_matmul_kernel`);
    # None without compute kernels. Sums of kernel durations (not the union): concurrent kernels count twice.
    compute_matmul_fraction: float | None = None
    # "kineto" (PyTorch profiler) or "tensorflow" (TF profiler trace viewer JSON: `tf_trace`)
    format: str = "kineto"
    # TF traces only: op time per model/layer graph scope over the profiled steps (tf_trace.layer_scope)
    scopes: list[ScopeTime] = field(default_factory=list)

    @property
    def step_time_mean_us(self) -> float | None:
        return float(np.mean([s.duration_us for s in self.steps])) if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: plain types only, no NaN/inf."""
        out = asdict(self)
        durations = [s.duration_us for s in self.steps]
        out["step_time_us"] = (
            {
                "mean": float(np.mean(durations)),
                "p50": float(np.percentile(durations, 50)),
                "p95": float(np.percentile(durations, 95)),
            }
            if durations
            else None
        )
        return jsonable(out)


# ------------------------------------------------------------------------------------------ reading


class _Accumulator:
    """What one pass keeps: compact columns, never the events."""

    def __init__(self) -> None:
        # GPU activities (stream != -1): start, duration, correlation, category, kernel-like flag
        self.g_ts = array("d")
        self.g_dur = array("d")
        self.g_corr = array("q")
        self.g_cat = array("b")
        self.g_kernel = array("b")  # stream >= 0 and correlation >= 0 (HTA's GPU kernel)
        # CPU-side events carrying a correlation id (cudaLaunchKernel...): start, correlation
        self.c_ts = array("d")
        self.c_corr = array("q")
        self.step_names: set[str] = set()
        self.last_step_start: float | None = None  # rounded as HTA rounds
        self.steps: dict[int, tuple[float, float]] = {}
        self.kernel_stats: dict[str, list[float]] = {}  # name -> [count, total, max, category]
        self.gpu_device_ids: Counter[int] = Counter()
        self.mem: dict[tuple[int, int], tuple[array, array, array, array, array]] = {}
        self.counts: Counter[str] = Counter()
        self.float_ts = False  # HTA rounds every timestamp when the `ts` column is float
        self.tf = TfTraceReader()  # a TensorFlow profiler trace, once its metadata says so

    def add(self, ev: dict[str, Any]) -> None:
        counts = self.counts
        counts["events"] += 1
        tf = self.tf
        if ev.get("ph") == "M":
            tf.note_metadata(ev)
            return
        if tf.active:
            normalized = tf.normalize(ev)
            if normalized is None:
                return
            ev = normalized
        name = ev.get("name")
        ts = ev.get("ts")
        if ts is None or isinstance(ts, float):
            self.float_ts = True
        if name == "[memory]":
            self._add_memory(ev)
            return
        cat = ev.get("cat")
        dur = ev.get("dur")
        if dur is None or cat is None or cat == "Trace" or ts is None:
            return
        if not isinstance(name, str):
            name = str(name)
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        stream = _as_int(args.get("stream"), -1)
        corr = _as_int(args.get("correlation"), -1)
        kernel_like = stream >= 0 and corr >= 0
        lcat = cat.lower() if isinstance(cat, str) else ""
        if lcat in ("cpu_op", "operator"):
            counts["cpu_ops"] += 1
        elif lcat in ("cuda_runtime", "runtime", "cuda_driver"):
            counts["runtime_calls"] += 1
        if stream != -1:
            kcat = kernel_category(name)
            self.g_ts.append(float(ts))
            self.g_dur.append(float(dur))
            self.g_corr.append(corr)
            self.g_cat.append(kcat)
            self.g_kernel.append(kernel_like)
            counts[("kernels", "communication_kernels", "memcpy", "memset", "other_gpu")[kcat]] += 1
            stat = self.kernel_stats.get(name)
            if stat is None:
                self.kernel_stats[name] = [1.0, float(dur), float(dur), float(kcat)]
            else:
                stat[0] += 1
                stat[1] += dur
                if dur > stat[2]:
                    stat[2] = float(dur)
            dev = args.get("device")
            if isinstance(dev, int):
                self.gpu_device_ids[dev] += 1
        if kernel_like or name in _SYNC_NAMES:
            return
        # CPU side, in HTA's sense: everything that is not a GPU kernel or a GPU sync event.
        if corr >= 0:
            self.c_ts.append(float(ts))
            self.c_corr.append(corr)
        if "ProfilerStep" in name:
            self.step_names.add(name)
            start = float(math.ceil(ts))
            if self.last_step_start is None or start > self.last_step_start:
                self.last_step_start = start
            m = _STEP_RE.search(name)
            if m and lcat != "gpu_user_annotation":
                step = int(m.group(1))
                if step not in self.steps:
                    self.steps[step] = (float(ts), float(dur))

    def _add_memory(self, ev: dict[str, Any]) -> None:
        args = ev.get("args") or {}
        if "Bytes" not in args or ev.get("ts") is None:
            return
        self.counts["memory_events"] += 1
        key = (_as_int(args.get("Device Type"), -1), _as_int(args.get("Device Id"), -1))
        cols = self.mem.get(key)
        if cols is None:
            cols = self.mem[key] = (array("d"), array("d"), array("q"), array("q"), array("q"))
        cols[0].append(float(ev["ts"]))
        cols[1].append(float(args.get("Ev Idx", len(cols[0]))))
        cols[2].append(_as_int(args.get("Bytes"), 0))
        cols[3].append(_as_int(args.get("Total Allocated"), -1))
        cols[4].append(_as_int(args.get("Total Reserved"), -1))


def _as_int(value: Any, default: int) -> int:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _reopenable(source: bytes | str | Path | IO[bytes]) -> tuple[bytes | str | Path | IO[bytes], IO[bytes] | None]:
    """A source that can be opened twice (header, then events); spools a non-seekable stream to disk."""
    if isinstance(source, (bytes, bytearray, memoryview, str, Path)):
        return source, None
    if source.seekable():
        return source, None
    # returned open: the caller reads it twice and closes it (the second element of the pair)
    spool = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # noqa: SIM115
    while chunk := source.read(1 << 20):
        spool.write(chunk)
    spool.seek(0)
    return spool, spool


def summarize_trace(source: bytes | Path | IO[bytes], *, max_bytes: int | None = None) -> TraceSummary:
    """Summary of one Kineto trace (one rank): GPU time breakdown, top kernels, steps, memory.

    `source`: the `.json`/`.json.gz` bytes, a path, or a binary stream (read from its current
    position). `max_bytes` bounds the decompressed JSON size.

    Raises `TraceFormatError` (bad JSON, truncated gzip, no `traceEvents`) or `TraceTooLargeError`.
    """
    src, spool = _reopenable(source)
    start = src.tell() if hasattr(src, "tell") else None
    try:
        with _open(src, max_bytes) as stream:
            header, has_events = read_header(stream)
        if not has_events:
            raise TraceFormatError("no traceEvents in the trace")
        if start is not None:
            src.seek(start)  # type: ignore[union-attr]
        acc = _Accumulator()
        with _open(src, max_bytes) as stream:
            for ev in iter_events(stream):
                if isinstance(ev, dict):
                    acc.add(ev)
            trace_bytes = stream.bytes_read
    finally:
        if spool is not None:
            spool.close()
    return _finish(acc, header, trace_bytes)


def _open(src: Any, max_bytes: int | None) -> Any:
    stream = open_trace(src, max_bytes=max_bytes)
    if not isinstance(src, (bytes, bytearray, memoryview, str, Path)):
        # The caller's stream stays open: close only our wrappers.
        return _NoCloseWrapper(stream)
    return stream


class _NoCloseWrapper:
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __enter__(self) -> Any:
        return self._stream

    def __exit__(self, *exc: object) -> None:
        return None


# ------------------------------------------------------------------------------------------ results


def _finish(acc: _Accumulator, header: dict[str, Any], trace_bytes: int) -> TraceSummary:
    notes: list[str] = []
    dist = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    rank = _as_int(dist.get("rank"), -1) if dist else -1
    world = _as_int(dist.get("world_size"), -1) if dist else -1
    backend = dist.get("backend") if dist and isinstance(dist.get("backend"), str) else None
    props = header.get("deviceProperties")
    props = props if isinstance(props, list) else []

    device: DeviceInfo | None = None
    if acc.gpu_device_ids:
        dev_id = acc.gpu_device_ids.most_common(1)[0][0]
        prop = next((p for p in props if isinstance(p, dict) and p.get("id") == dev_id), None) or {}
        major, minor = prop.get("computeMajor"), prop.get("computeMinor")
        device = DeviceInfo(
            device_id=dev_id,
            name=prop.get("name") if isinstance(prop.get("name"), str) else None,
            memory_total_bytes=_as_int(prop.get("totalGlobalMem"), -1) if "totalGlobalMem" in prop else None,
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            sm_count=_as_int(prop.get("numSms"), -1) if "numSms" in prop else None,
        )

    gpu_time = _gpu_breakdown(acc, notes)
    top = sorted(acc.kernel_stats.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    top_kernels = [
        KernelStat(
            name=name,
            category=CATEGORY_NAMES[int(s[3])],
            count=int(s[0]),
            total_us=float(s[1]),
            mean_us=float(s[1] / s[0]),
            max_us=float(s[2]),
        )
        for name, s in top
    ]
    step_spans = acc.tf.steps() if acc.tf.active else acc.steps
    steps = [StepTime(step=k, start_us=v[0], duration_us=v[1]) for k, v in sorted(step_spans.items())]
    if acc.tf.active:
        notes.append("TensorFlow profiler trace: steps are the profiler's step groups (group_id), numbered from 0")
    compute_total = matmul_total = 0.0
    for name, s in acc.kernel_stats.items():
        if int(s[3]) == COMPUTE:
            compute_total += s[1]
            if is_matmul_kernel(name):
                matmul_total += s[1]
    memory = _memory_timelines(acc, notes)
    gpu_mem = [m for m in memory if m.device.startswith("cuda")]
    peak_alloc = max((m.peak_allocated_bytes for m in gpu_mem), default=None)
    reserved = [m.peak_reserved_bytes for m in gpu_mem if m.peak_reserved_bytes is not None]
    counts = dict(acc.counts)
    counts["steps"] = len(steps)
    for key in ("events", "cpu_ops", "runtime_calls", "kernels", "communication_kernels", "memcpy", "memset",
                "other_gpu", "memory_events"):
        counts.setdefault(key, 0)
    return TraceSummary(
        rank=rank if rank >= 0 else None,
        world_size=world if world > 0 else None,
        distributed_backend=backend,
        device=device,
        devices_listed=len(props),
        trace_bytes=trace_bytes,
        gpu_time=gpu_time,
        top_kernels=top_kernels,
        steps=steps,
        memory=memory,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=max(reserved) if reserved else None,
        counts=counts,
        notes=notes,
        compute_matmul_fraction=matmul_total / compute_total if compute_total > 0 else None,
        format="tensorflow" if acc.tf.active else "kineto",
        scopes=acc.tf.scopes() if acc.tf.active else [],
    )


def _gpu_breakdown(acc: _Accumulator, notes: list[str]) -> GpuTimeBreakdown | None:
    if not acc.g_ts:
        return None
    ts = np.frombuffer(acc.g_ts, dtype=np.float64)
    end = ts + np.frombuffer(acc.g_dur, dtype=np.float64)
    corr = np.frombuffer(acc.g_corr, dtype=np.int64)
    cat = np.frombuffer(acc.g_cat, dtype=np.int8)
    kernel_like = np.frombuffer(acc.g_kernel, dtype=np.int8).astype(bool)
    if acc.float_ts:
        # HTA rounds ns-resolution traces (pytorch/pytorch#122425): start up, end down. A sub-microsecond
        # activity can then end before it starts; HTA keeps the negative length (and trips its own
        # `non_compute_time >= 0` assertion on such traces), we count it as zero.
        ts = np.ceil(ts)
        end = np.maximum(np.floor(end), ts)
    keep = np.ones(ts.shape[0], dtype=bool)
    limit = acc.last_step_start
    last_step_excluded = len(acc.step_names) > 1 and limit is not None
    if last_step_excluded and limit is not None:
        c_ts = np.frombuffer(acc.c_ts, dtype=np.float64)
        if acc.float_ts:
            c_ts = np.ceil(c_ts)
        launched = np.frombuffer(acc.c_corr, dtype=np.int64)[c_ts < limit]
        keep = np.where(kernel_like, np.isin(corr, launched), ts < limit)
        notes.append("GPU time counts activities launched before the last ProfilerStep began (as HTA)")
    elif not acc.step_names:
        notes.append("no ProfilerStep in the trace: GPU time covers every activity")
    ts, end, cat = ts[keep], end[keep], cat[keep]
    if ts.size == 0:
        return None
    span = float(end.max() - ts.min())
    cumulative = [0.0]
    for level in range(len(CATEGORY_NAMES)):
        mask = cat <= level
        cumulative.append(_union_length(ts[mask], end[mask]))
    by_cat = [cumulative[i + 1] - cumulative[i] for i in range(len(CATEGORY_NAMES))]
    busy = cumulative[-1]
    idle = span - busy
    compute = by_cat[COMPUTE]

    def pct(x: float) -> float:
        return 100.0 * x / span if span > 0 else 0.0

    return GpuTimeBreakdown(
        span_us=span,
        busy_us=busy,
        idle_us=idle,
        compute_us=compute,
        non_compute_us=busy - compute,
        communication_us=by_cat[COMMUNICATION],
        memcpy_us=by_cat[MEMCPY],
        memset_us=by_cat[MEMSET],
        other_us=by_cat[OTHER],
        idle_pct=pct(idle),
        compute_pct=pct(compute),
        non_compute_pct=pct(busy - compute),
        communication_pct=pct(by_cat[COMMUNICATION]),
        memcpy_pct=pct(by_cat[MEMCPY]),
        memset_pct=pct(by_cat[MEMSET]),
        other_pct=pct(by_cat[OTHER]),
        activities=int(ts.size),
        last_step_excluded=last_step_excluded,
    )


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [start, end)."""
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new_group = np.empty(s.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_group)
    group_end = np.maximum.reduceat(e, first)
    return float(np.sum(group_end - s[first]))


def _memory_timelines(acc: _Accumulator, notes: list[str]) -> list[MemoryTimeline]:
    out: list[MemoryTimeline] = []
    for (dev_type, dev_id), cols in sorted(acc.mem.items()):
        ts = np.frombuffer(cols[0], dtype=np.float64)
        order = np.lexsort((np.frombuffer(cols[1], dtype=np.float64), ts))
        ts = ts[order]
        delta = np.frombuffer(cols[2], dtype=np.int64)[order]
        total = np.frombuffer(cols[3], dtype=np.int64)[order]
        reserved_col = np.frombuffer(cols[4], dtype=np.int64)[order]
        device = (f"cuda:{dev_id}" if dev_type == KINETO_CUDA_DEVICE_TYPE
                  else ("cpu" if dev_type == 0 else f"type{dev_type}:{dev_id}"))
        if (total >= 0).all():
            source, allocated = "total_allocated", total
        else:
            source = "bytes_delta"
            allocated = np.cumsum(delta)
            low = int(allocated.min())
            if low < 0:
                allocated = allocated - low  # frees of blocks allocated before the window
            notes.append(f"{device}: memory rebuilt from Bytes deltas (a lower bound; reserved unknown)")
        reserved = reserved_col if (reserved_col >= 0).all() else None
        idx = minmax_indices(allocated, MEMORY_POINTS_MAX, keep_ends=True)
        out.append(
            MemoryTimeline(
                device=device,
                source=source,
                samples=int(ts.size),
                ts_us=ts[idx].tolist(),
                allocated_bytes=allocated[idx].tolist(),
                reserved_bytes=reserved[idx].tolist() if reserved is not None else None,
                peak_allocated_bytes=int(allocated.max()),
                peak_reserved_bytes=int(reserved.max()) if reserved is not None else None,
            )
        )
    return out


# ------------------------------------------------------------------------------------------ jobs


def combine_ranks(summaries: Iterable[TraceSummary | Mapping[str, Any]]) -> dict[str, Any]:
    """One job from its ranks' summaries: per-rank rows, job totals, the straggler by step time.

    A trace without `distributedInfo` counts as rank 0 when it is alone; two traces claiming one rank
    raise ValueError (the same file uploaded twice, or traces of two jobs). Accepts summaries or their
    `to_dict()` form (what the server stores per uploaded trace).
    """
    items = [s.to_dict() if isinstance(s, TraceSummary) else s for s in summaries]
    if not items:
        raise ValueError("no trace summaries to combine")
    ranked: dict[int, Mapping[str, Any]] = {}
    for s in items:
        rank = s.get("rank") if s.get("rank") is not None else (0 if len(items) == 1 else None)
        if rank is None:
            raise ValueError("several traces and one has no distributedInfo.rank: cannot tell the ranks apart")
        if rank in ranked:
            raise ValueError(f"two traces for rank {rank}")
        ranked[rank] = s
    world_sizes = {s["world_size"] for s in items if s.get("world_size") is not None}
    world_size = max(world_sizes) if world_sizes else None
    rows: list[dict[str, Any]] = []
    for rank in sorted(ranked):
        s = ranked[rank]
        g = s.get("gpu_time") or {}
        steps_us = s.get("step_time_us") or {}
        rows.append(
            {
                "rank": rank,
                "device": s.get("device"),
                "span_us": g.get("span_us"),
                "idle_us": g.get("idle_us"),
                "compute_us": g.get("compute_us"),
                "non_compute_us": g.get("non_compute_us"),
                "communication_us": g.get("communication_us"),
                "memcpy_us": g.get("memcpy_us"),
                "memset_us": g.get("memset_us"),
                "idle_pct": g.get("idle_pct"),
                "compute_pct": g.get("compute_pct"),
                "non_compute_pct": g.get("non_compute_pct"),
                "steps": len(s.get("steps") or ()),
                "step_time_mean_us": steps_us.get("mean"),
                "peak_allocated_bytes": s.get("peak_allocated_bytes"),
                "peak_reserved_bytes": s.get("peak_reserved_bytes"),
                # which profiler wrote the trace, and (TensorFlow) op time per model/layer scope
                "format": s.get("format") or "kineto",
                "scopes": s.get("scopes") or [],
            }
        )
    with_gpu = [r for r in rows if r["span_us"]]
    span_total = sum(r["span_us"] for r in with_gpu)

    def total(key: str) -> float | None:
        return sum(r[key] for r in with_gpu) if with_gpu else None

    def share(key: str) -> float | None:
        return 100.0 * sum(r[key] for r in with_gpu) / span_total if span_total else None

    totals = {
        "span_us": total("span_us"),
        "idle_us": total("idle_us"),
        "compute_us": total("compute_us"),
        "non_compute_us": total("non_compute_us"),
        "communication_us": total("communication_us"),
        "idle_pct": share("idle_us"),
        "compute_pct": share("compute_us"),
        "non_compute_pct": share("non_compute_us"),
        "peak_allocated_bytes": max((r["peak_allocated_bytes"] for r in rows if r["peak_allocated_bytes"] is not None),
                                    default=None),
        "peak_reserved_bytes": max((r["peak_reserved_bytes"] for r in rows if r["peak_reserved_bytes"] is not None),
                                   default=None),
    }
    timed = [r for r in rows if r["step_time_mean_us"] is not None]
    straggler = None
    if len(timed) > 1:
        slowest = max(timed, key=lambda r: r["step_time_mean_us"])
        median = float(np.median([r["step_time_mean_us"] for r in timed]))
        straggler = {
            "rank": slowest["rank"],
            "step_time_mean_us": slowest["step_time_mean_us"],
            "median_step_time_us": median,
            "slowdown_fraction": slowest["step_time_mean_us"] / median - 1.0 if median > 0 else None,
        }
    missing = sorted(set(range(world_size)) - set(ranked)) if world_size else []
    return jsonable(
        {
            "world_size": world_size,
            "ranks_present": len(ranked),
            "missing_ranks": missing,
            "per_rank": rows,
            "totals": totals,
            "straggler": straggler,
        }
    )
