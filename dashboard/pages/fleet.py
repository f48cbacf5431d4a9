"""Fleet overview (operators): KPIs, utilization heatmap, headroom distribution, goodput, GPUs needing attention,
wasteful jobs, energy."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html
from flask import current_app

from dashboard import data, figures
from dashboard import format as fmt
from dashboard.client import ApiError, gather
from dashboard.components import (
    APP_CONFIG_KEY,
    client_for,
    error_box,
    findings_list,
    is_operator,
    job_link,
    kpi,
    node_link,
    table,
)
from dashboard.session import AuthStore
from fleetprof.api_models import FleetSummary, Goodput, JobWaste

WINDOWS = (("6 hours", "6h"), ("24 hours", "24h"), ("7 days", "7d"), ("30 days", "30d"))
_GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False}


def layout(**_: Any) -> html.Div:
    refresh_ms = int(current_app.config[APP_CONFIG_KEY]["refresh_s"] * 1000)
    return html.Div([
        html.Div([
            html.H2("Fleet overview"),
            html.Label(["window ", dcc.Dropdown(id="fleet-window", options=[{"label": k, "value": v}
                                                                           for k, v in WINDOWS],
                                                value="24h", clearable=False, className="dropdown")]),
            html.Span(id="fleet-updated", className="muted"),
        ], className="page-head"),
        dcc.Interval(id="fleet-interval", interval=refresh_ms, n_intervals=0),
        html.Div(id="fleet-kpis", className="kpis"),
        dcc.Loading(dcc.Graph(id="fleet-heatmap", config=_GRAPH_CONFIG), type="dot"),
        html.Div([
            html.Div(dcc.Graph(id="fleet-energy", config=_GRAPH_CONFIG), className="half"),
            html.Div(dcc.Graph(id="fleet-headroom", config=_GRAPH_CONFIG), className="half"),
        ], className="row"),
        html.Section([html.H3("Goodput: allocated GPU-hours by what they did"), html.Div(id="fleet-goodput")],
                     className="card"),
        html.Section([html.H3("GPUs needing attention"), html.Div(id="fleet-attention")], className="card"),
        html.Section([html.H3("Most wasteful jobs"), html.Div(id="fleet-wasteful")], className="card"),
        html.Section([html.H3("Idle GPUs now"), html.Div(id="fleet-idle")], className="card"),
    ])


def kpi_cards(summary: FleetSummary, timeline: dict[str, Any] | None = None) -> list[html.Div]:
    """The summary's figures, each with its unit and source; the energy's source split from the timeline's
    per-hour sources when there is one."""
    sources = summary.sources
    unknown_now = summary.gpus_unknown_now
    energy_source: str | None = figures.energy_source_shares(timeline) if timeline else fmt.UNKNOWN
    energy_source = sources.get("energy_j") if energy_source == fmt.UNKNOWN else f"{energy_source} (hourly rollups)"
    return [
        kpi("GPUs", f"{fmt.count(summary.gpus_total, 'GPUs')} ({fmt.count(summary.gpus)} reporting)",
            "inventory + hourly rollups", id="kpi-gpus"),
        kpi("Busy share", fmt.fraction_pct(summary.busy_fraction),
            f"{sources.get('busy_gpu_hours', 'hourly rollups')}: {fmt.hours(summary.busy_gpu_hours)} busy "
            f"of {fmt.hours(summary.gpu_hours)}", id="kpi-busy"),
        kpi("Idle GPUs now", fmt.count(summary.idle_gpus_now, "GPUs")
            + (f" ({fmt.count(unknown_now)} unknown)" if unknown_now else ""),
            "NVML gpu_util_pct of each GPU's latest sample", id="kpi-idle"),
        kpi("Energy over window", fmt.energy(summary.energy_j), energy_source, id="kpi-energy"),
        kpi("Stranded memory", fmt.gib(summary.memory_stranded_bytes), sources.get("memory_stranded_bytes"),
            id="kpi-stranded"),
    ]


def wasteful_rows(jobs: list[JobWaste]) -> list[list[Any]]:
    return [[job_link(j.job_id) if j.job_id else fmt.UNKNOWN, fmt.text(j.team), fmt.count(j.gpus, "GPUs"),
             fmt.fraction_pct(j.gpu_busy_fraction), fmt.hours(j.wasted_gpu_hours), fmt.gib(j.memory_stranded_bytes),
             fmt.energy(j.idle_energy_j)] for j in jobs]


GOODPUT_COLUMNS = ["team", "allocated", "idle", "input-stalled", "throttled", "productive", "unknown",
                   "productive share"]


def goodput_rows(summary: FleetSummary) -> list[list[Any]]:
    """The fleet's row first, then one per team; each bucket in GPU-hours (they add up to `allocated`)."""
    def row(label: str, g: Goodput) -> list[Any]:
        return [label, fmt.hours(g.allocated_gpu_hours), fmt.hours(g.idle_gpu_hours),
                fmt.hours(g.input_stalled_gpu_hours), fmt.hours(g.throttled_gpu_hours),
                fmt.hours(g.productive_gpu_hours), fmt.hours(g.unknown_gpu_hours),
                fmt.fraction_pct(g.productive_fraction)]
    rows = [row("fleet", summary.goodput)] if summary.goodput is not None else []
    return rows + [row(t.team if t.team is not None else "(no team)", t) for t in summary.goodput_by_team]


def attention_rows(summary: FleetSummary) -> list[list[Any]]:
    return [[node_link(a.node), str(a.gpu_index), fmt.text(a.gpu_name), fmt.text(a.severity),
             findings_list(a.findings), a.gpu_uuid] for a in summary.gpus_needing_attention]


def register_callbacks(app: dash.Dash) -> None:
    inputs = (Input("fleet-window", "value"), Input("fleet-interval", "n_intervals"), Input("auth", "data"))

    def _need_operator(auth: AuthStore | None) -> html.Div | None:
        if is_operator(auth):
            return None
        return html.Div(["The fleet overview needs an operator token. See ", dcc.Link("your jobs", href="/jobs"),
                         " or ", dcc.Link("sign in", href="/signin"), " as an operator."], className="error",
                        id="fleet-need-operator")

    @app.callback(Output("fleet-kpis", "children"), Output("fleet-goodput", "children"),
                  Output("fleet-attention", "children"), Output("fleet-wasteful", "children"),
                  Output("fleet-idle", "children"), Output("fleet-updated", "children"),
                  Output("fleet-heatmap", "figure"), Output("fleet-energy", "figure"),
                  Output("fleet-headroom", "figure"), *inputs)
    def _fleet(window: str, _n: int, auth: AuthStore | None):
        """The whole page from three API calls made at once."""
        if (msg := _need_operator(auth)) is not None:
            empty = figures.empty_figure("operator token needed")
            return msg, "", "", "", "", "", empty, empty, empty
        try:
            with client_for(auth) as c:
                answer, t, h = gather(lambda: c.fleet_summary(window), lambda: c.fleet_timeline(window),
                                      lambda: c.fleet_headroom(window))
        except ApiError as exc:
            answer = t = h = exc
        try:
            s = answer if isinstance(answer, ApiError) else data.fleet_summary(answer)
        except ApiError as exc:
            s = exc
        if isinstance(t, ApiError):
            heatmap = energy = figures.empty_figure(f"timeline unavailable: {t}")
        else:
            heatmap, energy = figures.utilization_heatmap(t), figures.energy_over_time(t)
        headroom = figures.empty_figure(f"headroom unavailable: {h}") if isinstance(h, ApiError) \
            else figures.headroom_histogram(h)
        if isinstance(s, ApiError):
            return error_box(s, id="fleet-error"), "", "", "", "", "", heatmap, energy, headroom
        wasteful = table(["job", "team", "GPUs", "GPU busy", "wasted", "stranded memory", "idle energy"],
                         wasteful_rows(s.most_wasteful_jobs), id="fleet-wasteful-table",
                         empty="no job reports in this window")
        idle = table(["node", "GPU", "model", "uuid"],
                     [[node_link(g["node"]), str(g["index"]), fmt.text(g.get("name")), g["uuid"]]
                      for g in (s.model_extra or {}).get("idle_gpus") or []],  # not declared: a newer API's
                     empty=f"{fmt.count(s.idle_gpus_now, 'idle GPUs')} now (the API lists none by name)")
        kpis = kpi_cards(s, None if isinstance(t, ApiError) else t)
        goodput = table(GOODPUT_COLUMNS, goodput_rows(s), id="fleet-goodput-table",
                        empty="no job's GPU time in this window (or the collector predates goodput)")
        window = fmt.seconds(s.attention_window_s) if s.attention_window_s is not None else "recent window"
        attention = table(["node", "GPU", "model", "severity", f"findings (last {window})", "uuid"],
                          attention_rows(s), id="fleet-attention-table", empty="no GPU needs attention")
        return (kpis, goodput, attention, wasteful, idle, f"updated {fmt.timestamp(s.generated_at)}", heatmap, energy,
                headroom)


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/", name="Fleet", title="fleetprof · fleet", order=0, layout=layout)
