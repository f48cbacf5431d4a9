"""Jobs: filter by team, state, time and model (`?fingerprint=F`); search by job id or name; group the page's runs
by model (their fingerprint), each group linked to its characterization across configurations."""

from __future__ import annotations

import time
from typing import Any

import dash
from dash import ALL, Input, Output, State, dcc, html

from dashboard import data
from dashboard import format as fmt
from dashboard.client import ApiError
from dashboard.components import client_for, error_box, job_link, table
from dashboard.pages.compare import characterization_href, compare_href
from dashboard.session import AuthStore
from fleetprof.api_models import JobRead

PAGE_SIZE = 50
STATES = ("pending", "running", "finished", "failed", "killed", "oom", "lost")
WINDOWS = (("any time", ""), ("last hour", "3600"), ("last 24 hours", "86400"), ("last 7 days", "604800"),
           ("last 30 days", "2592000"))


def layout(team: str | None = None, state: str | None = None, q: str | None = None, fingerprint: str | None = None,
           **_: Any) -> html.Div:
    return html.Div([
        html.H2("Jobs"),
        html.Div([
            dcc.Input(id="jobs-q", type="search", placeholder="search job id or name", debounce=True,
                      value=q or "", className="text-input"),
            dcc.Input(id="jobs-team", type="text", placeholder="team", debounce=True, value=team or "",
                      className="text-input"),
            dcc.Dropdown(id="jobs-state", options=[{"label": s, "value": s} for s in STATES],
                         value=state if state in STATES else None, placeholder="any state", className="dropdown"),
            dcc.Dropdown(id="jobs-window", options=[{"label": k, "value": v} for k, v in WINDOWS], value="",
                         clearable=False, className="dropdown"),
            dcc.Input(id="jobs-fingerprint", type="text", placeholder="model fingerprint", debounce=True,
                      value=fingerprint or "", className="text-input"),
            dcc.Checklist(id="jobs-group", options=[{"label": " group runs of the same model", "value": "model"}],
                          value=[], className="group-toggle"),
        ], className="filters"),
        dcc.Store(id="jobs-offset", data=0),
        dcc.Loading(html.Div(id="jobs-table"), type="dot"),
        html.Div([dcc.Link("compare the selected runs", id="jobs-compare", href="/compare"),
                  html.Span(id="jobs-compare-hint", className="muted")], className="pager"),
        html.Div([html.Button("← previous", id="jobs-prev", n_clicks=0),
                  html.Span(id="jobs-count", className="muted"),
                  html.Button("next →", id="jobs-next", n_clicks=0)], className="pager"),
    ])


PICK = "jobs-pick"  # a row's checkbox: pick two or more runs to compare


COLUMNS = ["compare", "job", "name", "team", "state", "model", "node", "GPUs", "started", "duration"]


def model_name(job: JobRead) -> str | None:
    """The model class the hooks read (`metadata.framework.model_class`), without its module."""
    framework = job.metadata.get("framework")
    cls = framework.get("model_class") if isinstance(framework, dict) else None
    return cls.rsplit(".", 1)[-1] if isinstance(cls, str) and cls else None


def model_cell(job: JobRead) -> Any:
    """The run's model: its class and fingerprint, linked to the model's characterization; unknown without one."""
    if job.fingerprint is None:
        return fmt.UNKNOWN
    return dcc.Link(f"{model_name(job) or 'model'} · {job.fingerprint[:8]}", href=characterization_href(
        job.fingerprint), title=f"fingerprint {job.fingerprint}: this model across configurations")


def job_rows(items: list[JobRead]) -> list[list[Any]]:
    return [[dcc.Checklist(id={"type": PICK, "job": j.job_id}, options=[{"label": "", "value": j.job_id}], value=[],
                           className="pick"),
             job_link(j.job_id), fmt.text(j.name), fmt.text(j.team), j.state, model_cell(j), fmt.text(j.node),
             fmt.count(len(j.gpu_uuids), "GPUs"), fmt.timestamp(j.started_at), fmt.seconds(j.duration_s)]
            for j in items]


def grouped_by_model(items: list[JobRead]) -> html.Div:
    """The page's runs in one table per model (fingerprint), the groups in the order of their newest run; runs
    without a fingerprint last."""
    groups: dict[str | None, list[JobRead]] = {}
    for j in items:
        groups.setdefault(j.fingerprint, []).append(j)
    blocks = []
    for fp, runs in sorted(groups.items(), key=lambda kv: kv[0] is None):
        if fp is None:
            title: list[Any] = [f"no fingerprint (no hooks, or hooks before fingerprints) · {len(runs)} run(s)"]
        else:
            title = [f"{model_name(runs[0]) or 'model'} · {fp} · {len(runs)} run(s) on this page · ",
                     dcc.Link("across configurations", href=characterization_href(fp)), " · ",
                     dcc.Link("all its runs", href=f"/jobs?fingerprint={fp}")]
        blocks.append(html.Div([html.H4(title), table(COLUMNS, job_rows(runs))], className="jobs-group"))
    return html.Div(blocks or [html.Div("no jobs match", className="empty")], id="jobs-list")


def register_callbacks(app: dash.Dash) -> None:
    filters = (Input("jobs-q", "value"), Input("jobs-team", "value"), Input("jobs-state", "value"),
               Input("jobs-window", "value"), Input("jobs-fingerprint", "value"))

    @app.callback(Output("jobs-offset", "data"), Input("jobs-prev", "n_clicks"), Input("jobs-next", "n_clicks"),
                  *filters, State("jobs-offset", "data"), prevent_initial_call=True)
    def _page(_p: int, _n: int, _q: str, _t: str, _s: str, _w: str, _f: str, offset: int):
        trigger = dash.ctx.triggered_id
        if trigger == "jobs-next":
            return offset + PAGE_SIZE
        if trigger == "jobs-prev":
            return max(0, offset - PAGE_SIZE)
        return 0  # a filter changed: back to the first page

    @app.callback(Output("jobs-compare", "href"), Output("jobs-compare", "style"),
                  Output("jobs-compare-hint", "children"), Input({"type": PICK, "job": ALL}, "value"))
    def _picked(picked: list[list[str] | None]):
        return compare_selection(picked)

    @app.callback(Output("jobs-table", "children"), Output("jobs-count", "children"),
                  Input("jobs-offset", "data"), *filters, Input("jobs-group", "value"), Input("auth", "data"))
    def _jobs(offset: int, q: str, team: str, state: str, window: str, fingerprint: str, group: list[str] | None,
              auth: AuthStore | None):
        since = time.time() - float(window) if window else None
        try:
            with client_for(auth) as c:
                page = data.job_list(c.jobs(q=(q or "").strip() or None, team=(team or "").strip() or None,
                                            state=state, since=since, limit=PAGE_SIZE, offset=offset or 0,
                                            fingerprint=(fingerprint or "").strip() or None))
        except ApiError as exc:
            return error_box(exc), ""
        n = len(page.items)
        shown = f"{offset + 1}–{offset + n} of {page.total} jobs" if n else f"{page.total} jobs"
        if group and "model" in group:
            return grouped_by_model(page.items), shown
        return table(COLUMNS, job_rows(page.items), id="jobs-list", empty="no jobs match"), shown


def compare_selection(picked: list[list[str] | None]) -> tuple[str, dict[str, str], str]:
    """The compare link's address, style and hint for the rows' checkboxes (listed newest first: the oldest picked
    run becomes the baseline)."""
    ids = [job_id for value in reversed(picked) for job_id in (value or [])]
    if len(ids) < 2:
        return "/compare", {"display": "none"}, "tick two or more runs to compare them"
    return compare_href(ids), {}, f"{len(ids)} runs, the first ({ids[0]}) the baseline"


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/jobs", name="Jobs", title="fleetprof · jobs", order=2, layout=layout)
