"""Pure figure builders: API data in, `go.Figure` out. No I/O, no Dash.

Time axes carry epoch milliseconds on a plotly date axis (UTC): numeric arrays travel to the browser as
typed arrays, far cheaper than date strings for tens of thousands of points. Dense series use WebGL
(`go.Scattergl`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

GIB = 2**30
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
_BASE_LAYOUT: dict[str, Any] = {
    "template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 40}, "height": 320,
    "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
    "font": {"size": 12},
}


def epoch_ms(ts: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(ts, dtype=np.float64) * 1000.0


def _values(values: Sequence[float | None], scale: float = 1.0) -> np.ndarray:
    arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return arr / scale if scale != 1.0 else arr


def _layout(fig: go.Figure, *, title: str, y_title: str, date_x: bool = True, **extra: Any) -> go.Figure:
    fig.update_layout(**{**_BASE_LAYOUT, "title": {"text": title, "x": 0, "font": {"size": 14}}, **extra})
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    if date_x:
        fig.update_xaxes(type="date", title_text="time (UTC)")
    return fig


def empty_figure(message: str, *, title: str = "") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**{**_BASE_LAYOUT, "height": 220}, title={"text": title, "x": 0, "font": {"size": 14}},
                      xaxis={"visible": False}, yaxis={"visible": False},
                      annotations=[{"text": message, "showarrow": False, "font": {"size": 14, "color": "#666"},
                                    "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}])
    return fig


def gpu_label(uuid: str, index: int | None = None) -> str:
    short = uuid if len(uuid) <= 16 else f"{uuid[:8]}…{uuid[-4:]}"
    return f"GPU {index} ({short})" if index is not None else short


# ------------------------------------------------------------------------------------------------ job page


def memory_timeline(used: dict[str, Any] | None, steps: dict[str, Any] | None,
                    capacity_bytes: float | None) -> go.Figure:
    """NVML used memory per GPU vs the framework's allocated/reserved peaks per step, with the capacity line.

    `used` is a /timeseries?metric=memory_used_bytes answer; `steps` a /steps answer (or None).
    """
    fig = go.Figure()
    series = (used or {}).get("series") or []
    for i, s in enumerate(series):
        fig.add_trace(go.Scattergl(
            x=epoch_ms(s["ts"]), y=_values(s["values"], GIB), mode="lines", name=f"NVML used · {gpu_label(s['gpu_uuid'], i)}",
            line={"color": PALETTE[i % len(PALETTE)], "width": 1.5},
            hovertemplate="%{y:.2f} GiB<extra>NVML used</extra>"))
    if steps and steps.get("count"):
        ts = epoch_ms(steps["ts"])
        for key, label, dash in (("reserved_peak_bytes", "framework reserved (per-step peak)", "dot"),
                                 ("allocated_peak_bytes", "framework allocated (per-step peak)", "dash")):
            vals = _values(steps[key], GIB)
            if np.all(np.isnan(vals)):
                continue
            ranks = np.asarray(steps["rank"])
            for r in np.unique(ranks):
                sel = ranks == r
                fig.add_trace(go.Scattergl(
                    x=ts[sel], y=vals[sel], mode="lines", name=f"{label} · rank {r}",
                    line={"dash": dash, "width": 1.2, "color": "#444" if "reserved" in key else "#999"},
                    hovertemplate="%{y:.2f} GiB<extra>" + label + "</extra>"))
    if capacity_bytes:
        fig.add_hline(y=capacity_bytes / GIB, line={"color": "#d62728", "dash": "dash", "width": 1},
                      annotation_text=f"capacity {capacity_bytes / GIB:.1f} GiB", annotation_position="top left")
    if not fig.data:
        return empty_figure("no memory samples for this job", title="Device memory")
    return _layout(fig, title="Device memory (GiB)", y_title="GiB", uirevision="memory")


def metric_timeline(data: dict[str, Any] | None, *, title: str, y_title: str, scale: float = 1.0,
                    hover_unit: str = "", uirevision: str | None = None) -> go.Figure:
    """One WebGL line per GPU from a /timeseries answer."""
    series = (data or {}).get("series") or []
    fig = go.Figure()
    for i, s in enumerate(series):
        if not s["ts"]:
            continue
        fig.add_trace(go.Scattergl(x=epoch_ms(s["ts"]), y=_values(s["values"], scale), mode="lines",
                                   name=gpu_label(s["gpu_uuid"], i), line={"color": PALETTE[i % len(PALETTE)],
                                                                            "width": 1.2},
                                   hovertemplate="%{y:.1f} " + hover_unit + "<extra>%{fullData.name}</extra>"))
    if not fig.data:
        return empty_figure("no samples", title=title)
    return _layout(fig, title=title, y_title=y_title, uirevision=uirevision or title)


def step_time_histogram(wall_s: Sequence[float | None], *, p50_s: float | None = None,
                        p95_s: float | None = None) -> go.Figure:
    vals = _values(wall_s)
    vals = vals[~np.isnan(vals)]
    if vals.size == 0:
        return empty_figure("no step times: the job ran without framework hooks", title="Step time")
    fig = go.Figure(go.Histogram(x=vals * 1e3, nbinsx=60, marker={"color": PALETTE[0]},
                                 hovertemplate="%{x} ms: %{y} steps<extra></extra>"))
    for value, label in ((p50_s, "p50"), (p95_s, "p95")):
        if value is not None:
            fig.add_vline(x=value * 1e3, line={"dash": "dash", "color": "#444"},
                          annotation_text=f"{label} {value * 1e3:.1f} ms")
    return _layout(fig, title=f"Step time ({vals.size:,} steps)", y_title="steps", date_x=False,
                   xaxis_title="step time (ms)", bargap=0.02)


def layer_time_bars(layers: Sequence[dict[str, Any]], top: int = 20) -> go.Figure:
    rows = [r for r in layers if r.get("total_s") is not None][:top]
    if not rows:
        return empty_figure("no per-layer timings: the job ran without framework hooks", title="Layers")
    rows = rows[::-1]  # largest on top
    names = [str(r["module"]) for r in rows]
    fig = go.Figure()
    for key, label, color in (("forward_s", "forward", PALETTE[0]), ("backward_s", "backward", PALETTE[1])):
        fig.add_trace(go.Bar(y=names, x=[(r.get(key) or 0.0) for r in rows], name=label, orientation="h",
                             marker={"color": color}, hovertemplate="%{x:.3f} s<extra>" + label + "</extra>"))
    fig = _layout(fig, title="Time per layer (s, summed over steps)", y_title="", date_x=False, barmode="stack",
                  xaxis_title="seconds", height=max(260, 22 * len(rows) + 80))
    fig.update_yaxes(automargin=True)
    return fig


# ------------------------------------------------------------------------------------------------ fleet page


def utilization_heatmap(timeline: dict[str, Any] | None) -> go.Figure:
    """node×GPU rows, hourly columns, colour = mean GPU utilization (%); gaps where a GPU did not report."""
    hours = (timeline or {}).get("hours") or []
    gpus = (timeline or {}).get("gpus") or []
    if not hours or not gpus:
        return empty_figure("no hourly rollups in this window", title="GPU utilization by hour")
    z = np.array([[np.nan if v is None else v for v in row] for row in timeline["gpu_util_mean_pct"]],
                 dtype=np.float64)
    labels = [f"{g['node']} · GPU {g['index']}" for g in gpus]
    fig = go.Figure(go.Heatmap(
        z=z, x=epoch_ms(hours) + 1800e3, y=labels, zmin=0, zmax=100, colorscale="Viridis",
        colorbar={"title": {"text": "%"}, "thickness": 12}, hoverongaps=False,
        hovertemplate="%{y}<br>%{x|%Y-%m-%d %H:00} UTC<br>%{z:.1f} %<extra></extra>"))
    height = min(900, max(260, 14 * len(gpus) + 100))
    fig = _layout(fig, title=f"GPU utilization by hour ({len(gpus):,} GPUs, hourly mean %)", y_title="",
                  height=height)
    fig.update_yaxes(autorange="reversed", showticklabels=len(gpus) <= 60, rangemode=None)
    return fig


def headroom_histogram(headroom: dict[str, Any] | None) -> go.Figure:
    jobs = (headroom or {}).get("jobs") or []
    vals = np.array([j["headroom_bytes"] for j in jobs if j.get("headroom_bytes") is not None], dtype=np.float64)
    if vals.size == 0:
        return empty_figure("no job reports with a known headroom", title="Job memory headroom")
    fig = go.Figure(go.Histogram(x=vals / GIB, nbinsx=40, marker={"color": PALETTE[2]},
                                 hovertemplate="%{x} GiB: %{y} jobs<extra></extra>"))
    return _layout(fig, title=f"Job memory headroom (GiB unused at peak, {vals.size:,} jobs)", y_title="jobs",
                   date_x=False, xaxis_title="headroom (GiB)", bargap=0.02)


def energy_over_time(timeline: dict[str, Any] | None) -> go.Figure:
    hours = (timeline or {}).get("hours") or []
    energy = (timeline or {}).get("energy_j") or []
    if not hours or all(e is None for e in energy):
        return empty_figure("no energy in this window", title="Fleet energy by hour")
    kwh = _values(energy, 3.6e6)
    fig = go.Figure(go.Bar(x=epoch_ms(hours) + 1800e3, y=kwh, marker={"color": PALETTE[1]},
                           customdata=(timeline.get("energy_gpus") or [None] * len(hours)),
                           hovertemplate="%{x|%Y-%m-%d %H:00} UTC<br>%{y:.2f} kWh from %{customdata} GPUs"
                                         "<extra></extra>"))
    return _layout(fig, title="Fleet energy by hour (kWh, integrated power)", y_title="kWh", bargap=0.05)


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
    from datetime import datetime, timezone

    text = str(value).replace("T", " ")
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else \
        "%Y-%m-%d %H:%M" if ":" in text else "%Y-%m-%d"
    return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
