"""Small layout pieces shared by the pages, and the per-request API client.

Every user-supplied string reaches the page as a Dash component's text (escaped by React): nothing here
builds HTML from strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from dash import dcc, html
from flask import current_app

from dashboard import format as fmt
from dashboard.client import ApiClient, ApiError
from dashboard.session import AuthStore, request_token
from fleetprof.jobid import path_segment

APP_CONFIG_KEY = "FLEETPROF_DASHBOARD"


def client_for(auth: AuthStore | None) -> ApiClient:
    """The API client for this request's session cookie (or the dashboard's default token, if it has one).
    `auth` (the browser's store) carries no token: callbacks take it as an input to re-run on sign-in."""
    cfg = current_app.config[APP_CONFIG_KEY]
    token = request_token() or cfg["default_token"]
    if not token:
        raise ApiError(401, "not signed in")
    return ApiClient(cfg["api_url"], token, timeout_s=cfg["timeout_s"])


def is_operator(auth: AuthStore | None) -> bool:
    if request_token():
        return auth is not None and auth.get("scope") == "operator"
    return current_app.config[APP_CONFIG_KEY]["default_scope"] == "operator"


def _id(id: str | None) -> dict[str, Any]:
    """The `id` keyword of a Dash component, left out when it has none."""
    return {"id": id} if id else {}


def error_box(exc: Exception | str, *, id: str | None = None) -> html.Div:
    """An API error as a sentence a person can act on."""
    if isinstance(exc, ApiError):
        if exc.status == 401:
            children: Any = ["Not signed in, or the token was refused. ", dcc.Link("Sign in", href="/signin"), "."]
        elif exc.status in (403, 404):
            children = f"Not found, or not visible to this token ({exc.status}): {exc.detail}"
        elif exc.unreachable:
            children = exc.detail
        else:
            children = f"The API answered {exc.status}: {exc.detail}"
    else:
        children = str(exc)
    return html.Div(children, className="error", role="alert", **_id(id))


def kpi(label: str, value: str, source: str | None = None, *, id: str | None = None) -> html.Div:
    """A figure with its unit (inside `value`) and where it came from."""
    return html.Div([
        html.Div(label, className="kpi-label"),
        html.Div(value, className="kpi-value", **_id(f"{id}-value" if id else None)),
        html.Div(f"source: {source}" if source else "source: unknown", className="kpi-source"),
    ], className="kpi", **_id(id))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, id: str | None = None,
          empty: str = "nothing to show") -> html.Div | html.Table:
    """A plain HTML table; cells are strings or Dash components (e.g. dcc.Link)."""
    if not rows:
        return html.Div(empty, className="empty", **_id(id))
    return html.Table([
        html.Thead(html.Tr([html.Th(c) for c in columns])),
        html.Tbody([html.Tr([html.Td(cell) for cell in row]) for row in rows]),
    ], className="data", **_id(id))


def job_href(job_id: str) -> str:
    """The job page of `job_id`: a '/' in it travels as %2F, as in the API's paths (fleetprof.jobid)."""
    return f"/jobs/{path_segment(job_id)}"


def job_link(job_id: str) -> dcc.Link:
    return dcc.Link(job_id, href=job_href(job_id))


def node_link(node: str) -> dcc.Link:
    return dcc.Link(node, href=f"/nodes/{quote(node, safe='')}")


def by_suffix(key: str, value: Any) -> str:
    """A report field by the unit its name carries (`fleetprof.units`, the one rule); a dict or list as its size."""
    if isinstance(value, (dict, list)):
        return f"{len(value)} item(s)"
    return fmt.by_key(key, value) if value is None or isinstance(value, (bool, int, float)) else fmt.text(value)


def section(title: str, *children: Any, id: str | None = None) -> html.Section:
    return html.Section([html.H3(title), *children], className="card", **_id(id))


def findings_list(findings: Sequence[Any], *, empty: str = "no findings") -> html.Ul | html.Span:
    """Health findings (fleetprof.report.HealthFinding, or their JSON) as a list: kind, severity, the summary
    (which carries the seconds, share, count and cost with their units) and the source (which says when the data
    came from the NVML test double or a replay)."""
    items = []
    for f in findings:
        get = f.get if isinstance(f, dict) else lambda k, f=f: getattr(f, k, None)
        source = get("source")
        items.append(html.Li([html.B(str(get("kind"))), f" ({get('severity') or 'info'}): ", str(get("summary")),
                              *([html.Span(f" [{source}]", className="muted")] if source else [])]))
    return html.Ul(items, className="findings") if items else html.Span(empty, className="muted")
