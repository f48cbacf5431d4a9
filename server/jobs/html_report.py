"""The standalone HTML report (`?format=html`, `fleetprof report --format html`): one file, plots included.

Every user-supplied string is escaped; plotly.js is inlined once so the page works offline, attached to a ticket.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.io import to_html

from fleetprof import units

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
th{background:#f4f4f4}.src{color:#777;font-size:.85em}h1 small{color:#777;font-weight:normal}
"""


MAX_ROWS = 50  # rows of a record list (layers, swapped tensors) shown; the JSON report has them all


def _records(rows: list[dict[str, Any]], parent_suffix: str | None) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    def td(key: str, value: Any) -> str:
        return f"<td>{html.escape(units.cell(key, value, parent_suffix=parent_suffix, in_record=True))}</td>"

    body = "".join("<tr>" + "".join(td(c, row.get(c)) for c in columns) + "</tr>" for row in rows[:MAX_ROWS])
    more = f"<p class=src>+{len(rows) - MAX_ROWS} more rows in the JSON report</p>" if len(rows) > MAX_ROWS else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _rows(section: dict[str, Any], sources: dict[str, str], prefix: str, parent_suffix: str | None = None) -> str:
    rows = []
    for key, value in section.items():
        suffix = units.unit_suffix(key) or parent_suffix
        if units.is_records(value):
            cell = _records(value, suffix)
        elif units.is_nested(value):
            cell = f"<table>{_rows(value, sources, f'{prefix}.{key}', suffix)}</table>"
        else:
            cell = html.escape(units.cell(key, value, parent_suffix=parent_suffix))
        src = units.source(sources.get(f"{prefix}.{key}")) or ""
        rows.append(f"<tr><th>{html.escape(key)}</th><td>{cell}</td><td class=src>{html.escape(src)}</td></tr>")
    return "".join(rows)


def _table(title: str, section: dict[str, Any], sources: dict[str, str], prefix: str) -> str:
    return f"<h2>{html.escape(title)}</h2><table>{_rows(section, sources, prefix)}</table>"


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
             f"{html.escape(units.seconds(report.get('duration_s')))} · analyzed at "
             f"{html.escape(units.timestamp(report.get('analyzed_at')))}</p>"]
    for key in ("memory", "time", "utilization", "energy", "optimization"):
        if isinstance(report.get(key), dict) and report[key]:
            parts.append(_table(key.capitalize(), report[key], sources, key))
    gpus = report.get("gpus") or []
    if gpus:
        parts.append(f"<h2>GPUs</h2>{_records(gpus, None)}")
    health = report.get("health")
    if isinstance(health, dict):
        items = "".join(f"<li><b>{html.escape(str(f.get('kind')))}</b> on {html.escape(str(f.get('gpu_uuid')))}: "
                        f"{html.escape(str(f.get('summary')))}"
                        + (f" <i>[{html.escape(str(f['source']))}]</i>" if f.get("source") else "") + "</li>"
                        for f in health.get("findings") or [])
        parts.append(f"<h2>Health</h2><ul>{items or '<li>no findings</li>'}</ul>")
    recs = report.get("recommendations") or []
    if recs:
        items = "".join(f"<li><b>{html.escape(str(r.get('summary')))}</b> — {html.escape(str(r.get('reason')))}"
                        f" <i>(saving: {html.escape(units.by_key('saving', r.get('saving')))})</i></li>"
                        for r in recs)
        parts.append(f"<h2>Recommendations</h2><ul>{items}</ul>")
    first = True
    for metric, title, unit in (("memory_used_bytes", "Device memory used (NVML)", "bytes"),
                                ("power_w", "Power (NVML)", "W"), ("gpu_util_pct", "GPU utilization", "%")):
        if series.get(metric):
            parts.append(to_html(_figure(title, unit, series[metric]), full_html=False,
                                 include_plotlyjs=first))
            first = False
    return (f"<!doctype html><html><head><meta charset=utf-8><title>fleetprof report "
            f"{html.escape(str(report.get('job_id')))}</title><style>{_STYLE}</style></head><body>"
            + "".join(parts) + "</body></html>")
