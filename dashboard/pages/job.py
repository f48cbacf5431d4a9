"""Job report page: memory, power and utilization timelines, step times, layers, energy, recommendations,
optimization plans, and the HTML report to download."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate


POINTS_PER_GPU = 1500  # ~ one min/max pair per horizontal pixel of a full-width plot
_GRAPH_CONFIG = {"displaylogo": False}


def layout(job_id: str | None = None, **_: Any) -> html.Div:
    from urllib.parse import unquote

    job_id = unquote(job_id or "")
    return html.Div([
        dcc.Store(id="job-id", data=job_id),
        dcc.Store(id="job-capacity"),
        html.Div([html.H2(["Job ", html.Span(job_id, id="job-title")]),
                  html.Button("Download HTML report", id="job-download-button", n_clicks=0),
                  dcc.Download(id="job-download")], className="page-head"),
        dcc.Loading(html.Div(id="job-summary"), type="dot"),
        dcc.Graph(id="job-memory", config=_GRAPH_CONFIG),
        html.Div([html.Div(dcc.Graph(id="job-power", config=_GRAPH_CONFIG), className="half"),
                  html.Div(dcc.Graph(id="job-util", config=_GRAPH_CONFIG), className="half")], className="row"),
        html.P("Drag on a plot to zoom: the series is fetched again at full resolution for the range. "
               "Double-click to reset.", className="muted"),
        html.Div(id="job-details"),
    ])


# ------------------------------------------------------------------------------------------------ pieces


def summary_section(job: dict[str, Any], report: dict[str, Any]) -> list[Any]:
    from dashboard import format as fmt
    from dashboard.components import kpi, table

    mem, tm, ut = report.get("memory") or {}, report.get("time") or {}, report.get("utilization") or {}
    src = report.get("sources") or {}
    step = tm.get("step_time_s") or {}
    meta = table(["name", "team", "state", "node", "GPUs", "started", "ended", "duration", "analyzed"], [[
        fmt.text(job.get("name")), fmt.text(job.get("team")), job.get("state", fmt.UNKNOWN), fmt.text(job.get("node")),
        fmt.count(len(job.get("gpu_uuids") or [])), fmt.timestamp(job.get("started_at")),
        fmt.timestamp(job.get("ended_at")), fmt.seconds(job.get("duration_s")), fmt.timestamp(report.get("analyzed_at")),
    ]], id="job-meta")
    replay = (job.get("metadata") or {}).get("replay")
    kpis = html.Div([
        kpi("Peak memory used", fmt.gib(mem.get("peak_used_bytes")), src.get("memory.peak_used_bytes"),
            id="job-peak-used"),
        kpi("Peak allocated", fmt.gib(mem.get("peak_allocated_bytes")), src.get("memory.peak_allocated_bytes"),
            id="job-peak-allocated"),
        kpi("Peak reserved", fmt.gib(mem.get("peak_reserved_bytes")), src.get("memory.peak_reserved_bytes"),
            id="job-peak-reserved"),
        kpi("Headroom at peak", fmt.gib(mem.get("headroom_bytes")), "capacity − NVML peak", id="job-headroom"),
        kpi("Fragmentation", fmt.gib(mem.get("fragmentation_bytes")), src.get("memory.fragmentation_bytes"),
            id="job-fragmentation"),
        kpi("GPU utilization (mean / p95)", f"{fmt.pct(ut.get('gpu_mean_pct'))} / {fmt.pct(ut.get('gpu_p95_pct'))}",
            src.get("utilization.gpu_mean_pct"), id="job-util-mean"),
        kpi("GPU busy", fmt.fraction_pct(tm.get("gpu_busy_fraction")), src.get("time.gpu_busy_fraction"),
            id="job-busy"),
        kpi("Steps", fmt.count(tm.get("steps")), src.get("time.steps"), id="job-steps"),
        kpi("Step time p50 / p95", f"{fmt.seconds(step.get('p50'))} / {fmt.seconds(step.get('p95'))}",
            src.get("time.steps"), id="job-step-time"),
        kpi("Iteration period", fmt.seconds(tm.get("period_s")), src.get("time.period_s"), id="job-period"),
    ], className="kpis")
    warnings = []
    if mem.get("oom_detected") or mem.get("oom_suspected"):
        what = "Out of memory" if mem.get("oom_detected") else "Out of memory suspected"
        warnings.append(html.Div([html.B(what + ": "), "; ".join(str(e) for e in mem.get("oom_evidence") or [])],
                                 className="error", id="job-oom"))
    if replay:
        warnings.append(html.Div("This job's telemetry is a replay of a recording, not live NVML.",
                                 className="notice"))
    return [*warnings, meta, kpis]


def energy_card(report: dict[str, Any]) -> html.Section:
    from dashboard import format as fmt
    from dashboard.components import section, table

    e = report.get("energy") or {}
    source = e.get("source")
    source_text = {"counter": "NVML total-energy counter (hardware)",
                   "integrated_power": "integrated power samples (no hardware energy counter)"}.get(source, source)
    rows = [
        ["energy", fmt.energy(e.get("energy_j"))], ["kWh (GPU)", fmt.count(e.get("kwh")) if e.get("kwh") is None
                                                    else f"{e['kwh']:.4f} kWh"],
        ["facility kWh (× PUE)", fmt.UNKNOWN if e.get("facility_kwh") is None else
         f"{e['facility_kwh']:.4f} kWh (PUE {e.get('pue')})"],
        ["mean power", fmt.watts(e.get("mean_power_w"))],
        ["energy per step", fmt.energy(e.get("energy_per_step_j"))],
        ["energy per sample", fmt.energy(e.get("per_sample_j"))],
        ["idle energy", f"{fmt.energy(e.get('idle_energy_j'))} ({fmt.fraction_pct(e.get('idle_energy_fraction'))})"],
        ["CO2e", f"{fmt.grams(e.get('co2e_g'))} at {fmt.count(e.get('grid_intensity_g_per_kwh'), 'g/kWh')}"],
        ["cost", f"{fmt.usd(e.get('cost_usd'))} at {fmt.usd(e.get('price_per_kwh_usd'))}/kWh"],
    ]
    return section("Energy", html.P(["source: ", html.B(fmt.text(source_text), id="job-energy-source")]),
                   table(["", "value"], rows, id="job-energy"), id="job-energy-card")


def recommendations_section(report: dict[str, Any]) -> html.Section:
    from dashboard import format as fmt
    from dashboard.components import by_suffix, section

    recs = report.get("recommendations") or []
    items = []
    for r in recs:
        saving = r.get("saving")
        saving_text = ", ".join(f"{k}: {by_suffix(k, v)}" for k, v in saving.items()) if isinstance(saving, dict) \
            else fmt.text(saving) if saving is not None else None
        items.append(html.Li([html.B(fmt.text(r.get("summary"))), html.Span(f" ({r.get('kind')})", className="muted"),
                              html.Div(["why: ", fmt.text(r.get("reason"))]),
                              html.Div(f"saving: {saving_text}") if saving_text else None]))
    body = html.Ul(items, id="job-recommendations") if items else html.Div("no recommendations", className="empty")
    return section("Recommendations", body)


def optimization_section(report: dict[str, Any]) -> html.Section | None:
    """Offset / swap plans and findings, drawn from whatever fields the plan carries (units from the names)."""
    from dashboard.components import by_suffix, section, table

    opt = report.get("optimization")
    if not opt:
        return None
    parts: list[Any] = []
    for name, plan in opt.items():
        title = name.replace("_", " ")
        if isinstance(plan, dict):
            scalars = [[k.replace("_", " "), by_suffix(k, v)] for k, v in plan.items()
                       if not isinstance(v, (dict, list))]
            lists = [(k, v) for k, v in plan.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
            parts.append(html.H4(title))
            parts.append(table(["", "value"], scalars, empty="no figures"))
            for k, rows in lists:
                cols = [c for c in rows[0] if not isinstance(rows[0][c], (dict, list))][:8]
                parts.append(html.H5(f"{k.replace('_', ' ')} ({len(rows)})"))
                parts.append(table(cols, [[by_suffix(c, r.get(c)) for c in cols] for r in rows[:25]]))
        elif isinstance(plan, list) and plan and isinstance(plan[0], dict):
            cols = [c for c in plan[0] if not isinstance(plan[0][c], (dict, list))][:8]
            parts += [html.H4(title), table(cols, [[by_suffix(c, r.get(c)) for c in cols] for r in plan[:25]])]
        else:
            parts += [html.H4(title), html.Div(by_suffix(name, plan))]
    return section("Optimization plans", *parts, id="job-optimization")


def layers_section(report: dict[str, Any]) -> html.Section:
    from dashboard import figures
    from dashboard import format as fmt
    from dashboard.components import section, table

    layers = (report.get("time") or {}).get("layers") or []
    rows = [[fmt.text(r.get("module")), fmt.text(r.get("module_type")), fmt.seconds(r.get("forward_s")),
             fmt.seconds(r.get("backward_s")), fmt.seconds(r.get("total_s")), fmt.fraction_pct(r.get("time_fraction")),
             fmt.gib(r.get("activation_bytes"), 3), fmt.count(r.get("calls"))] for r in layers]
    children: list[Any] = [table(["module", "type", "forward", "backward", "total", "share", "activations", "calls"],
                                 rows, id="job-layers", empty="no per-layer data: the job ran without framework hooks")]
    if layers:
        children.insert(0, dcc.Graph(figure=figures.layer_time_bars(layers), config=_GRAPH_CONFIG))
    return section("Layers (framework hooks)", *children)


def gpus_section(report: dict[str, Any]) -> html.Section:
    from dashboard import format as fmt
    from dashboard.components import section, table

    rows = [[g.get("uuid"), fmt.text(g.get("name")), fmt.gib(g.get("memory_total_bytes")),
             fmt.gib(g.get("peak_used_bytes")), fmt.gib(g.get("headroom_bytes")), fmt.pct(g.get("gpu_util_mean_pct")),
             fmt.watts(g.get("mean_power_w")), f"{fmt.energy(g.get('energy_j'))} ({fmt.text(g.get('energy_source'))})",
             fmt.count(g.get("samples"))] for g in report.get("gpus") or []]
    return section("GPUs", table(["uuid", "model", "capacity", "peak used (NVML)", "headroom", "mean util",
                                  "mean power", "energy (source)", "samples"], rows, id="job-gpus"))


def sources_section(report: dict[str, Any]) -> html.Section:
    from dashboard import format as fmt
    from dashboard.components import section, table

    rows = [[k, fmt.text(v) if v is not None else "unknown (not measured)"]
            for k, v in sorted((report.get("sources") or {}).items())]
    return section("Where each figure came from", table(["figure", "source"], rows))


def _capacity(report: dict[str, Any] | None) -> float | None:
    caps = [g.get("memory_total_bytes") for g in (report or {}).get("gpus") or [] if g.get("memory_total_bytes")]
    return max(caps) if caps else None


# ------------------------------------------------------------------------------------------------ callbacks


def register_callbacks(app: dash.Dash) -> None:
    from dashboard import figures
    from dashboard.client import ApiError
    from dashboard.components import client_for, error_box

    @app.callback(Output("job-summary", "children"), Output("job-details", "children"),
                  Output("job-title", "children"), Output("job-capacity", "data"), Output("job-memory", "figure"),
                  Input("job-id", "data"), Input("auth", "data"))
    def _report(job_id: str, auth: dict[str, Any] | None):  # type: ignore[no-untyped-def]
        from dashboard.format import text

        try:
            with client_for(auth) as c:
                job = c.job(job_id)
                report = c.report(job_id)
                try:
                    steps = c.steps(job_id)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    steps = None  # this API does not serve per-step series
                used = c.timeseries(job_id, "memory_used_bytes", points=POINTS_PER_GPU)
        except ApiError as exc:
            return (error_box(exc, id="job-error"), [], job_id, dash.no_update,
                    figures.empty_figure("not available", title="Device memory"))
        step = (report.get("time") or {}).get("step_time_s") or {}
        hist = figures.step_time_histogram((steps or {}).get("wall_s") or [], p50_s=step.get("p50"),
                                           p95_s=step.get("p95"))
        details = [html.Div([html.Div(energy_card(report), className="half"),
                             html.Div(recommendations_section(report), className="half")], className="row"),
                   dcc.Graph(id="job-step-hist", figure=hist, config=_GRAPH_CONFIG), optimization_section(report), layers_section(report), gpus_section(report), sources_section(report)]
        title = [job_id, html.Span(f" · {text(job.get('name'))}", className="muted")] if job.get("name") else job_id
        capacity = {"capacity_bytes": _capacity(report), "has_steps": bool(steps and steps.get("count"))}
        memory = figures.memory_timeline(used, steps, capacity["capacity_bytes"])
        return summary_section(job, report), [d for d in details if d is not None], title, capacity, memory

    def _range(relayout: dict[str, Any] | None) -> tuple[float | None, float | None]:
        """since/until for this call; PreventUpdate when only the plot's layout changed and it is not a zoom.

        Several inputs can arrive in one call (e.g. the report's capacity and the plot's first autosize):
        anything but relayoutData among them means a fresh draw of the whole job."""
        triggered = set(dash.ctx.triggered_prop_ids)
        if triggered and all(t.endswith(".relayoutData") for t in triggered):
            rng = figures.relayout_range(relayout)
            if rng is None:
                raise PreventUpdate
            if rng is not False:
                return rng  # type: ignore[return-value]
        return None, None

    @app.callback(Output("job-memory", "figure", allow_duplicate=True), Input("job-memory", "relayoutData"),
                  State("job-id", "data"), State("job-capacity", "data"), State("auth", "data"),
                  prevent_initial_call=True)
    def _memory_zoom(relayout: dict[str, Any] | None, job_id: str,  # type: ignore[no-untyped-def]
                     capacity: dict[str, Any] | None, auth: dict[str, Any] | None):
        """Zoom (or reset) on the memory plot: the range again at full resolution."""
        if capacity is None:
            raise PreventUpdate
        since, until = _range(relayout)
        try:
            with client_for(auth) as c:
                used = c.timeseries(job_id, "memory_used_bytes", points=POINTS_PER_GPU, since=since, until=until)
                steps = c.steps(job_id, since=since, until=until) if capacity.get("has_steps") else None
        except ApiError as exc:
            return figures.empty_figure(str(exc), title="Device memory")
        return figures.memory_timeline(used, steps, capacity.get("capacity_bytes"))

    def _metric_callback(graph: str, metric: str, title: str, y_title: str, unit: str) -> None:
        @app.callback(Output(graph, "figure"), Input("job-id", "data"), Input("auth", "data"),
                      Input(graph, "relayoutData"), State(graph, "figure"))
        def _cb(job_id: str, auth: dict[str, Any] | None, relayout: dict[str, Any] | None,  # type: ignore[no-untyped-def]
                current: dict[str, Any] | None):
            # Until the plot holds data, any trigger (the graph's own first autosize included) is a first draw.
            drawn = bool(current and current.get("data"))
            since, until = _range(relayout) if drawn else (None, None)
            try:
                with client_for(auth) as c:
                    data = c.timeseries(job_id, metric, points=POINTS_PER_GPU, since=since, until=until)
            except ApiError as exc:
                return figures.empty_figure(str(exc), title=title)
            return figures.metric_timeline(data, title=title, y_title=y_title, hover_unit=unit, uirevision=graph)

    _metric_callback("job-power", "power_w", "Power (W, NVML)", "W", "W")
    _metric_callback("job-util", "gpu_util_pct", "GPU utilization (%, NVML)", "%", "%")

    @app.callback(Output("job-download", "data"), Input("job-download-button", "n_clicks"), State("job-id", "data"),
                  State("auth", "data"), prevent_initial_call=True)
    def _download(n: int, job_id: str, auth: dict[str, Any] | None):  # type: ignore[no-untyped-def]
        if not n:
            raise PreventUpdate
        try:
            with client_for(auth) as c:
                html_text = c.report_html(job_id)
        except ApiError:
            raise PreventUpdate from None
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in job_id)
        return dcc.send_string(html_text, f"fleetprof-report-{safe}.html", type="text/html")


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path_template="/jobs/<job_id>", name="Job", title="fleetprof · job", layout=layout)
