"""The standalone HTML report (`?format=html`, `fleetprof report --format html`): one file, plots included.

Every user-supplied string is escaped; plotly.js is inlined once so the page works offline, attached to a ticket.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.graph_objects as go
from plotly.io import to_html

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
th{background:#f4f4f4}.src{color:#777;font-size:.85em}h1 small{color:#777;font-weight:normal}
"""


def _fmt(value: Any, key: str) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        if key.endswith("_bytes"):
            return f"{value / 2**30:.3f} GiB"
        return f"{value:,.4g}"
    if isinstance(value, int) and key.endswith("_bytes"):
        return f"{value / 2**30:.3f} GiB ({value:,} B)"
    return str(value)


def _table(title: str, section: dict[str, Any], sources: dict[str, str], prefix: str) -> str:
    rows = []
    for key, value in section.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        src = sources.get(f"{prefix}.{key}") or ""
        rows.append(f"<tr><th>{html.escape(key)}</th><td>{html.escape(_fmt(value, key))}</td>"
                    f"<td class=src>{html.escape(src)}</td></tr>")
    return f"<h2>{html.escape(title)}</h2><table>{''.join(rows)}</table>"


def _figure(title: str, unit: str, series: list[Any]) -> str:
    fig = go.Figure()
    for s in series:
        fig.add_trace(go.Scattergl(x=[t * 1000 for t in s.ts], y=s.values, name=s.gpu_uuid, mode="lines"))
    fig.update_layout(title=title, xaxis={"type": "date"}, yaxis={"title": unit}, height=320,
                      margin={"l": 60, "r": 20, "t": 40, "b": 40})
    return fig


def render_report_html(report: dict[str, Any], series: dict[str, list[Any]]) -> str:
    sources = report.get("sources") or {}
    parts = [f"<h1>fleetprof report <small>{html.escape(str(report.get('job_id')))}</small></h1>",
             f"<p>State: <b>{html.escape(str(report.get('state')))}</b> · duration "
             f"{html.escape(_fmt(report.get('duration_s'), 'duration_s'))} s · analyzed at "
             f"{html.escape(str(report.get('analyzed_at')))}</p>"]
    for key in ("memory", "time", "utilization", "energy"):
        if isinstance(report.get(key), dict):
            parts.append(_table(key.capitalize(), report[key], sources, key))
    gpus = report.get("gpus") or []
    if gpus:
        head = "".join(f"<th>{html.escape(k)}</th>" for k in gpus[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v, k))}</td>" for k, v in g.items()) + "</tr>"
                       for g in gpus)
        parts.append(f"<h2>GPUs</h2><table><tr>{head}</tr>{body}</table>")
    recs = report.get("recommendations") or []
    if recs:
        items = "".join(f"<li><b>{html.escape(str(r.get('summary')))}</b> — {html.escape(str(r.get('reason')))}"
                        f" <i>({html.escape(str(r.get('saving')))})</i></li>" for r in recs)
        parts.append(f"<h2>Recommendations</h2><ul>{items}</ul>")
    first = True
    for metric, title, unit in (("memory_used_bytes", "Device memory used (NVML)", "bytes"),
                                ("power_w", "Power (NVML)", "W"), ("gpu_util_pct", "GPU utilization", "%")):
        if series.get(metric):
            parts.append(to_html(_figure(title, unit, series[metric]), full_html=False,
                                 include_plotlyjs=True if first else False))
            first = False
    return (f"<!doctype html><html><head><meta charset=utf-8><title>fleetprof report "
            f"{html.escape(str(report.get('job_id')))}</title><style>{_STYLE}</style></head><body>"
            + "".join(parts) + "</body></html>")
