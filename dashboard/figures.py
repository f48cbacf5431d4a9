"""Pure figure builders: API data in, `go.Figure` out. No I/O, no Dash.

Time axes carry epoch milliseconds on a plotly date axis (UTC): numeric arrays travel to the browser as
typed arrays, far cheaper than date strings for tens of thousands of points.

Lines are SVG (`go.Scatter`), not WebGL: every series arrives downsampled by the API to about two points per
horizontal pixel, which SVG draws in milliseconds, while WebGL falls back to software rendering wherever the
browser has no GPU (headless, VMs, remote desktops): bench/dashboard.py measured 4-8 s per 8-GPU plot there
against under 0.1 s in SVG. Browsers also cap a page's WebGL contexts (about 16).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard import format as fmt
from fleetprof.report import LayerRow

GIB = 2**30
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
# The look of plotly's "plotly_white" template, set directly: naming the template made plotly.py copy and validate
# the whole template into every figure, 40 % of the job page's figure building (bench/dashboard.py).
_AXIS_STYLE: dict[str, Any] = {"gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "zerolinecolor": "#EBF0F8",
                               "zerolinewidth": 2, "automargin": True}
_BASE_LAYOUT: dict[str, Any] = {
    "template": "none", "paper_bgcolor": "white", "plot_bgcolor": "white", "colorway": list(PALETTE),
    "margin": {"l": 60, "r": 20, "t": 40, "b": 40}, "height": 320, "hovermode": "closest",
    # right-aligned above the plot: the title sits on the left
    "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 1, "xanchor": "right"},
    "hoverlabel": {"namelength": -1},
    "font": {"size": 12, "color": "#2a3f5f"},
}


def epoch_ms(ts: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(ts, dtype=np.float64) * 1000.0


def _values(values: Sequence[float | None], scale: float = 1.0) -> np.ndarray:
    arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return arr / scale if scale != 1.0 else arr


def _layout(fig: go.Figure, *, title: str, y_title: str, date_x: bool = True, subtitle: str | None = None,
            **extra: Any) -> go.Figure:
    head: dict[str, Any] = {"text": title, "x": 0, "font": {"size": 14}}
    if subtitle:
        head["subtitle"] = {"text": subtitle, "font": {"size": 11, "color": "#666"}}
        extra.setdefault("margin", {**_BASE_LAYOUT["margin"], "t": 60})
    fig.update_layout(**{**_BASE_LAYOUT, "title": head, **extra})
    fig.update_yaxes(title_text=y_title, rangemode="tozero", **_AXIS_STYLE)
    fig.update_xaxes(**({"type": "date", "title_text": "time (UTC)"} if date_x else {}), **_AXIS_STYLE)
    return fig


def empty_figure(message: str, *, title: str = "") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**{**_BASE_LAYOUT, "height": 220}, title={"text": title, "x": 0, "font": {"size": 14}},
                      xaxis={"visible": False}, yaxis={"visible": False},
                      annotations=[{"text": message, "showarrow": False, "font": {"size": 14, "color": "#666"},
                                    "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}])
    return fig


# ------------------------------------------------------------------------------------------------ job page


# Time plots carry one line per GPU: their legend goes to the right, where more rows do not hide the title.
_SIDE_LEGEND = {"orientation": "v", "yanchor": "top", "y": 1, "x": 1.01, "xanchor": "left", "font": {"size": 11}}


def _gpu_name(s: dict[str, Any], i: int) -> str:
    return f"GPU {s.get('gpu_index', i)}"


def _gpu_hover(s: dict[str, Any], i: int) -> str:
    return f"{_gpu_name(s, i)} · {s['gpu_uuid']}"


def _x_range(fig: go.Figure, x_range: tuple[float, float] | None) -> go.Figure:
    """Show exactly the zoomed range (epoch s) the data was fetched for; all time plots of a page share it."""
    if x_range is not None:
        fig.update_xaxes(range=[x_range[0] * 1000.0, x_range[1] * 1000.0], autorange=False)
    return fig


def memory_timeline(used: dict[str, Any] | None, steps: dict[str, Any] | None,
                    capacity_bytes: float | None = None, *,
                    x_range: tuple[float, float] | None = None) -> go.Figure:
    """NVML used memory per GPU vs the framework's allocated/reserved peaks per step, with the capacity line.

    `used` is a /timeseries?metric=memory_used_bytes answer; `steps` a /steps answer (or None). Rank r is drawn in
    GPU r's colour; the line style says the source (solid NVML, dotted reserved, dashed allocated). The capacity
    is `capacity_bytes`, else the largest `memory_total_bytes` the series carry.
    """
    fig = go.Figure()
    series = (used or {}).get("series") or []
    for i, s in enumerate(series):
        fig.add_trace(go.Scatter(
            x=epoch_ms(s["ts"]), y=_values(s["values"], GIB), mode="lines", name=f"NVML used · {_gpu_name(s, i)}",
            line={"color": PALETTE[i % len(PALETTE)], "width": 1.5},
            hovertemplate="%{y:.2f} GiB<extra>NVML used · " + _gpu_hover(s, i) + "</extra>"))
    if steps and steps.get("count"):
        ts = epoch_ms(steps["ts"])
        ranks = np.asarray(steps["rank"])
        for key, label, dash in (("reserved_peak_bytes", "allocator reserved (step peak)", "dot"),
                                 ("allocated_peak_bytes", "allocator allocated (step peak)", "dash")):
            vals = _values(steps[key], GIB)
            if np.all(np.isnan(vals)):
                continue
            for n, r in enumerate(np.unique(ranks)):
                sel = ranks == r
                fig.add_trace(go.Scatter(
                    x=ts[sel], y=vals[sel], mode="lines", name=label, legendgroup=key, showlegend=n == 0,
                    line={"dash": dash, "width": 1.2, "color": PALETTE[int(r) % len(PALETTE)]},
                    hovertemplate="%{y:.2f} GiB<extra>" + f"{label} · rank {r}" + "</extra>"))
    if capacity_bytes is None:
        caps = [s.get("memory_total_bytes") for s in series if s.get("memory_total_bytes")]
        capacity_bytes = max(caps) if caps else None
    if capacity_bytes:
        fig.add_hline(y=capacity_bytes / GIB, line={"color": "#d62728", "dash": "dash", "width": 1},
                      annotation_text=f"capacity {capacity_bytes / GIB:.1f} GiB", annotation_position="top left")
    if not fig.data:
        return empty_figure("no memory samples for this job", title="Device memory")
    fig = _layout(fig, title="Device memory (GiB): NVML used per GPU vs the framework's allocator per rank "
                             "(rank r in GPU r's colour)", y_title="GiB", uirevision=repr(x_range), legend=_SIDE_LEGEND,
                  height=420)
    return _x_range(fig, x_range)


def metric_timeline(data: dict[str, Any] | None, *, title: str, y_title: str, scale: float = 1.0,
                    hover_unit: str = "", x_range: tuple[float, float] | None = None,
                    overlay: dict[str, Any] | None = None, overlay_name: str = "") -> go.Figure:
    """One line per GPU from a /timeseries answer; `overlay` (another answer in the same unit, e.g. NVML GPM's SM
    activity beside NVML utilization) adds a dotted line per GPU in the GPU's colour, named `overlay_name`, and the
    title says so when there is one."""
    series = (data or {}).get("series") or []
    fig = go.Figure()
    for i, s in enumerate(series):
        if not s["ts"]:
            continue
        fig.add_trace(go.Scatter(x=epoch_ms(s["ts"]), y=_values(s["values"], scale), mode="lines",
                                 name=_gpu_name(s, i), line={"color": PALETTE[i % len(PALETTE)], "width": 1.2},
                                 hovertemplate="%{y:.1f} " + hover_unit + "<extra>" + _gpu_hover(s, i) + "</extra>"))
    drawn = len(fig.data)
    for i, s in enumerate((overlay or {}).get("series") or []):
        values = _values(s["values"], scale)
        if not s["ts"] or np.all(np.isnan(values)):
            continue  # a GPU without the overlay's signal (no GPM before Hopper): no line, not a line at 0
        fig.add_trace(go.Scatter(x=epoch_ms(s["ts"]), y=values, mode="lines", name=f"{_gpu_name(s, i)} {overlay_name}",
                                 line={"color": PALETTE[i % len(PALETTE)], "width": 1.2, "dash": "dot"},
                                 hovertemplate="%{y:.1f} " + hover_unit + f" {overlay_name}<extra>"
                                               + _gpu_hover(s, i) + "</extra>"))
    if not fig.data:
        return empty_figure("no samples", title=title)
    if len(fig.data) > drawn:
        title = f"{title}; dotted: {overlay_name}"
    return _x_range(_layout(fig, title=title, y_title=y_title, uirevision=repr(x_range), legend=_SIDE_LEGEND),
                    x_range)


def histogram_quantile(edges: Sequence[float], counts: Sequence[int], total: int, q: float) -> float | None:
    """The q-quantile read off binned counts (linear within the bin); None when it lies past the last bin."""
    target = q * total
    seen = 0.0
    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True):
        if c and seen + c >= target:
            return lo + (hi - lo) * (target - seen) / c
        seen += c
    return None


def _slowest_rank_per_step(steps: dict[str, Any]) -> np.ndarray:
    """Each step's time is its slowest rank's (as the report counts it); steps without a step number count alone."""
    vals = _values(steps.get("wall_s") or [])
    numbers = steps.get("step")
    if numbers is not None and len(numbers) == vals.size and vals.size:
        uniq, inverse = np.unique(np.asarray(numbers), return_inverse=True)
        worst = np.full(uniq.size, np.nan)
        np.fmax.at(worst, inverse, vals)
        vals = worst
    return vals[~np.isnan(vals)]


def step_time_histogram(steps: dict[str, Any] | None, *, zoomed: bool = False) -> go.Figure:
    """Step wall time from a /steps answer: its `wall_s_histogram` (every step in the range, counted by the API)
    when it has one, else a histogram of the steps it lists; p50 and p95 marked."""
    hist = (steps or {}).get("wall_s_histogram")
    x_title = "step time (ms)"
    if hist and hist.get("count"):
        edges = np.asarray(hist["edges_s"], dtype=np.float64)
        n = int(hist["count"])
        ms = edges * 1e3
        fig = go.Figure(go.Bar(x=(ms[:-1] + ms[1:]) / 2, y=hist["counts"], width=np.diff(ms),
                               marker={"color": PALETTE[0]}, customdata=np.stack([ms[:-1], ms[1:]], axis=1),
                               hovertemplate="%{customdata[0]:.1f}–%{customdata[1]:.1f} ms: %{y} steps"
                                             "<extra></extra>"))
        if hist.get("above"):
            x_title += f"; {hist['above']:,} slower steps, up to {hist['max_s'] * 1e3:,.0f} ms, not shown"
        p50, p95 = (histogram_quantile(edges.tolist(), hist["counts"], n, q) for q in (0.5, 0.95))
    else:
        vals = _slowest_rank_per_step(steps or {})
        if vals.size == 0:
            return empty_figure("no step times: the job ran without framework hooks", title="Step time")
        fig = go.Figure(go.Histogram(x=vals * 1e3, nbinsx=60, marker={"color": PALETTE[0]},
                                     hovertemplate="%{x} ms: %{y} steps<extra></extra>"))
        n = int(vals.size)
        p50, p95 = (float(np.percentile(vals, q)) for q in (50, 95))
    for value, label, side in ((p50, "p50", "top left"), (p95, "p95", "top right")):
        if value is not None:
            fig.add_vline(x=value * 1e3, line={"dash": "dash", "color": "#444"}, annotation_position=side,
                          annotation_text=f"{label} {value * 1e3:,.1f} ms")
    where = " in the zoomed range" if zoomed else ""
    return _layout(fig, title=f"Step time ({n:,} steps{where}; slowest rank per step)", y_title="steps",
                   date_x=False, xaxis_title=x_title, bargap=0.02)


def layer_time_bars(layers: Sequence[LayerRow], top: int = 20) -> go.Figure:
    rows = [r for r in layers if r.total_s is not None][:top]
    if not rows:
        return empty_figure("no per-layer timings: the job ran without framework hooks", title="Layers")
    rows = rows[::-1]  # largest on top
    names = [r.module for r in rows]
    fig = go.Figure()
    for seconds, label, color in (([r.forward_s for r in rows], "forward", PALETTE[0]),
                                  ([r.backward_s for r in rows], "backward", PALETTE[1])):
        fig.add_trace(go.Bar(y=names, x=[s or 0.0 for s in seconds], name=label, orientation="h",
                             marker={"color": color}, hovertemplate="%{x:.3f} s<extra>" + label + "</extra>"))
    fig = _layout(fig, title="Time per layer (s, mean per sampled step, children included)", y_title="",
                  date_x=False, barmode="stack", xaxis_title="seconds", height=max(260, 22 * len(rows) + 80),
                  legend={"orientation": "h", "yanchor": "top", "y": -0.12, "x": 1, "xanchor": "right"})
    fig.update_yaxes(automargin=True)
    return fig


def memory_plan_bars(offset_plan: dict[str, Any] | None, swap_plan: dict[str, Any] | None) -> go.Figure:
    """The memory plans side by side (GiB): the lower bound (most bytes live at once), the offset plan's peak,
    the swap plan's peak and what the caching allocator really reserved."""
    offset_plan, swap_plan = offset_plan or {}, swap_plan or {}
    bars = [(label, value, color) for label, value, color in (
        ("lower bound (max live)", offset_plan.get("lower_bound_bytes"), PALETTE[2]),
        ("offset plan peak", offset_plan.get("planned_bytes"), PALETTE[0]),
        ("swap plan peak", swap_plan.get("new_peak_bytes"), PALETTE[4]),
        ("observed reserved (allocator)", offset_plan.get("observed_reserved_bytes"), PALETTE[3]),
    ) if value is not None]
    if not bars:
        return empty_figure("no memory plan figures", title="Memory plans")
    fig = go.Figure(go.Bar(y=[b[0] for b in bars][::-1], x=[b[1] / GIB for b in bars][::-1], orientation="h",
                           marker={"color": [b[2] for b in bars][::-1]},
                           text=[f"{b[1] / GIB:,.2f} GiB" for b in bars][::-1], textposition="auto",
                           hovertemplate="%{y}: %{x:.2f} GiB<extra></extra>"))
    fig = _layout(fig, title="Peak device memory under each plan (GiB)", y_title="", date_x=False,
                  xaxis_title="GiB", height=60 * len(bars) + 90)
    fig.update_yaxes(automargin=True)
    return fig


# The breakdown's parts in stacking order (bottom first) with their legend labels; activations per module
# replace the `activations` total where the split is known.
_BREAKDOWN_PARTS = (("weights", "weights"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
                    ("persistent_unsplit", "persistent (weights+grads+optimizer)"), ("activations", "activations"),
                    ("inputs", "inputs"), ("temporaries_and_workspaces", "temporaries & workspaces"),
                    ("step_allocations", "allocated in the window (activations + temporaries)"),
                    ("allocator_rounding", "allocator rounding"), ("cached_free", "cached free (reserved - allocated)"),
                    ("cuda_context", "CUDA context"))


def memory_breakdown_bar(breakdowns: Sequence[tuple[str, dict[str, Any] | None]], *,
                         title: str = "Memory at the peak by what holds it (GiB)") -> go.Figure:
    """One stacked bar per (label, MemoryBreakdown as a dict): the parts with a known size, each trace one part
    (activations and step allocations one trace per top-level module where split), hover naming the part's
    source. Unknown parts are left out."""
    present = [(label, b) for label, b in breakdowns if b]
    if not present:
        return empty_figure("no memory breakdown", title=title)
    labels = [label for label, _ in present]
    series: dict[str, tuple[list[float | None], list[str]]] = {}

    def add(name: str, i: int, nbytes: int | None, source: str) -> None:
        values, sources = series.setdefault(name, ([None] * len(present), [""] * len(present)))
        values[i] = None if nbytes is None else nbytes / GIB
        sources[i] = source

    for i, (_, b) in enumerate(present):
        for key, name in _BREAKDOWN_PARTS:
            part = b.get(key) or {}
            split = {"activations": "activations_by_module", "step_allocations": "step_allocations_by_module"}
            if key in split and b.get(split[key]):
                for m in b[split[key]]:
                    add(f"{name}: {m['module']}", i, m["bytes"], str(part.get("source", "")))
                continue
            if part.get("bytes"):
                add(name, i, part["bytes"], str(part.get("source", "")))
    fig = go.Figure()
    for name, (values, sources) in series.items():
        fig.add_trace(go.Bar(name=name, x=labels, y=values, customdata=sources,
                             hovertemplate=f"{name}: %{{y:.3f}} GiB<br>%{{customdata}}<extra></extra>"))
    fig = _layout(fig, title=title, y_title="GiB", date_x=False, barmode="stack", legend=_SIDE_LEGEND,
                  height=360)
    return fig


# ------------------------------------------------------------------------------------ configurations (compare page)
def configuration_label(c: Any) -> str:
    """A configuration in a few words: "1x A100-80GB · batch 64 · amp_bf16 · pytorch 2.13.0" (unknown axes left
    out)."""
    gpu = (f"{c.gpu_count}x {c.gpu_type}" if c.gpu_count and c.gpu_type else
           str(c.gpu_type) if c.gpu_type else f"{c.gpu_count} GPUs" if c.gpu_count is not None else None)
    parts = [gpu, f"batch {c.batch_size}" if c.batch_size is not None else None, c.precision, c.framework]
    return " · ".join(p for p in parts if p)


def configuration_bars(configurations: Sequence[Any], *, figure: str, title: str, y_title: str,
                       scale: float = 1.0) -> go.Figure:
    """One bar per configuration (`Configuration` of fleetprof.api_models) of one figure (a field name, e.g.
    `samples_per_s`), divided by `scale`; unknown values leave a gap and are named in the subtitle."""
    labels = [configuration_label(c) for c in configurations]
    values = [getattr(c, figure) for c in configurations]
    if all(v is None for v in values):
        return empty_figure(f"{figure}: unknown for every configuration", title=title)
    unknown = [label for label, v in zip(labels, values, strict=True) if v is None]
    runs = [c.runs for c in configurations]
    fig = go.Figure(go.Bar(x=labels, y=_values(values, scale), customdata=runs,
                           hovertemplate=f"%{{x}}<br>%{{y:.4g}} {y_title}<br>median of %{{customdata}} run(s)"
                                         "<extra></extra>"))
    return _layout(fig, title=title, y_title=y_title, date_x=False, height=340,
                   subtitle=("unknown for " + ", ".join(unknown)) if unknown else None)


# ------------------------------------------------------------------------------------------------ fleet page


HOUR_MS = 3600e3
# Tick every N hours, the first N giving at most 12 ticks, for windows up to two days; longer ones: plotly's own.
_HOUR_TICK_STEPS = (1, 2, 3, 6, 12)


def hourly_axis(fig: go.Figure, hours: Sequence[float]) -> go.Figure:
    """The x axis of an hourly figure spans whole hours, the first hour's start to the last one's end. A window of
    one hour has a single column, which plotly autoranged to a sliver around its centre: sub-millisecond ticks."""
    first, last = min(hours), max(hours)
    fig.update_xaxes(range=[first * 1000.0, last * 1000.0 + HOUR_MS], autorange=False)
    span_h = (last - first) / 3600.0 + 1
    if span_h <= 48:
        step = next(n for n in _HOUR_TICK_STEPS if span_h / n <= 12)
        fig.update_xaxes(tick0=first * 1000.0, dtick=step * HOUR_MS, tickformat="%H:%M\n%b %d")
    return fig


def utilization_heatmap(timeline: dict[str, Any] | None) -> go.Figure:
    """node×GPU rows, hourly columns, colour = mean GPU utilization (%); gaps where a GPU did not report."""
    timeline = timeline or {}
    hours = (timeline or {}).get("hours") or []
    gpus = (timeline or {}).get("gpus") or []
    if not hours or not gpus:
        return empty_figure("no hourly rollups in this window", title="GPU utilization by hour")
    z = np.array([[np.nan if v is None else v for v in row] for row in timeline["gpu_util_mean_pct"]],
                 dtype=np.float64)
    # One column per hour from the first to the last (hours with no rollup at all are gaps), each one hour wide:
    # with x as centres, plotly sized a single column 1 ms wide and stretched columns across missing hours.
    first = min(hours)
    cols = np.rint((np.asarray(hours, dtype=np.float64) - first) / 3600.0).astype(np.int64)
    grid = np.full((z.shape[0], int(cols.max()) + 1), np.nan)
    grid[:, cols] = z
    labels = [f"{g['node']} · GPU {g['index']}" for g in gpus]
    fig = go.Figure(go.Heatmap(
        z=grid, x0=first * 1000.0 + HOUR_MS / 2, dx=HOUR_MS, y=labels, zmin=0, zmax=100, colorscale="Viridis",
        colorbar={"title": {"text": "%"}, "thickness": 12}, hoverongaps=False,
        hovertemplate="%{y}<br>%{x|%Y-%m-%d %H:00} UTC<br>%{z:.1f} %<extra></extra>"))
    height = min(900, max(260, 14 * len(gpus) + 100))
    fig = _layout(fig, title=f"GPU utilization by hour ({len(gpus):,} GPUs, hourly mean %)", y_title="",
                  height=height)
    fig.update_yaxes(autorange="reversed", showticklabels=len(gpus) <= 60, rangemode=None)
    return hourly_axis(fig, hours)


def headroom_histogram(headroom: dict[str, Any] | None) -> go.Figure:
    jobs = (headroom or {}).get("jobs") or []
    vals = np.array([j["headroom_bytes"] for j in jobs if j.get("headroom_bytes") is not None], dtype=np.float64)
    if vals.size == 0:
        return empty_figure("no job reports with a known headroom", title="Job memory headroom")
    fig = go.Figure(go.Histogram(x=vals / GIB, nbinsx=40, marker={"color": PALETTE[2]},
                                 hovertemplate="%{x} GiB: %{y} jobs<extra></extra>"))
    return _layout(fig, title=f"Job memory headroom (GiB unused at peak, {vals.size:,} jobs)", y_title="jobs",
                   date_x=False, xaxis_title="headroom (GiB)", bargap=0.02)


ENERGY_SOURCE_ORDER = ("hardware_counter", "integrated_power", "mixed", "unrecorded")
_ENERGY_COLORS = {"hardware_counter": PALETTE[1], "integrated_power": PALETTE[4], "mixed": PALETTE[8],
                  "unrecorded": PALETTE[7]}


def energy_source_shares(timeline: dict[str, Any] | None) -> str:
    """Where the window's fleet energy came from, e.g. "NVML energy counter 87 %, integrated power 13 %";
    "unknown" when the API does not say."""
    by_source = (timeline or {}).get("energy_by_source_j") or {}
    totals = {k: sum(v for v in by_source[k] if v is not None) for k in ENERGY_SOURCE_ORDER if k in by_source}
    total = sum(totals.values())
    if not total:
        return fmt.UNKNOWN
    if len([v for v in totals.values() if v]) == 1:
        return fmt.energy_source(next(k for k, v in totals.items() if v))
    return ", ".join(f"{fmt.energy_source(k)} {100 * v / total:.0f} %" for k, v in totals.items() if v)


def energy_over_time(timeline: dict[str, Any] | None) -> go.Figure:
    """Fleet energy per hour (kWh), stacked by where it came from (NVML energy counter, integrated power...)."""
    timeline = timeline or {}
    hours = (timeline or {}).get("hours") or []
    energy = (timeline or {}).get("energy_j") or []
    if not hours or all(e is None for e in energy):
        return empty_figure("no energy in this window", title="Fleet energy by hour")
    x = epoch_ms(hours) + 1800e3
    gpus = timeline.get("energy_gpus") or [None] * len(hours)
    by_source = timeline.get("energy_by_source_j")
    fig = go.Figure()
    if by_source:
        for key in (k for k in ENERGY_SOURCE_ORDER if k in by_source):
            fig.add_trace(go.Bar(x=x, y=_values(by_source[key], 3.6e6), name=fmt.energy_source(key),
                                 marker={"color": _ENERGY_COLORS[key]}, customdata=gpus,
                                 hovertemplate="%{x|%Y-%m-%d %H:00} UTC<br>%{y:.2f} kWh (" + fmt.energy_source(key)
                                               + ")<br>fleet: %{customdata} GPUs<extra></extra>"))
        source = energy_source_shares(timeline)
    else:  # an API that does not say where its energy came from
        fig.add_trace(go.Bar(x=x, y=_values(energy, 3.6e6), marker={"color": PALETTE[1]}, customdata=gpus,
                             name="energy", hovertemplate="%{x|%Y-%m-%d %H:00} UTC<br>%{y:.2f} kWh from "
                                                          "%{customdata} GPUs<extra></extra>"))
        source = fmt.UNKNOWN
    fig.update_traces(width=0.95 * HOUR_MS)  # one hour wide: a lone bar was as thin as plotly's sliver of a range
    fig = _layout(fig, title="Fleet energy by hour (kWh)", subtitle=f"source: {source}", y_title="kWh",
                  barmode="stack", showlegend=len(fig.data) > 1,
                  legend={"orientation": "h", "yanchor": "top", "y": -0.3, "x": 0, "traceorder": "normal"})
    return hourly_axis(fig, hours)


# ------------------------------------------------------------------------------------------------ zoom


def relayout_range(relayout: dict[str, Any] | None) -> tuple[float, float] | None | bool:
    """The x range (epoch s) a zoom selected; False when the user reset the zoom; None when nothing x-related.

    Plotly reports a date-axis range as strings in UTC ('2026-07-14 10:00:00.123'), or as numbers (ms).
    """
    if not relayout:
        return None
    if relayout.get("xaxis.autorange"):
        return False
    lo, hi = relayout.get("xaxis.range[0]"), relayout.get("xaxis.range[1]")
    if lo is None and isinstance(relayout.get("xaxis.range"), list):
        lo, hi = relayout["xaxis.range"]
    if lo is None or hi is None:
        return None
    return _to_epoch_s(lo), _to_epoch_s(hi)


def _to_epoch_s(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value) / 1000.0
    text = str(value).replace("T", " ")
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else \
        "%Y-%m-%d %H:%M" if ":" in text else "%Y-%m-%d"
    return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
