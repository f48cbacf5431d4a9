"""Sign in with an API token (kept in an HttpOnly session cookie: dashboard/session.py)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from flask import current_app, request

from dashboard.client import ApiClient, ApiError
from dashboard.components import APP_CONFIG_KEY, error_box
from dashboard.session import fingerprint, set_session


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Sign in"),
        html.P("Paste a fleetprof API token (`fleetprof token create --scope operator`, or a team token). "
               "It is kept in a session cookie that page scripts cannot read, until you sign out or close the "
               "browser, and sent to the API with each request."),
        dcc.Input(id="signin-token", type="password", placeholder="token", autoComplete="off",
                  className="token-input", debounce=False),
        html.Button("Sign in", id="signin-submit", n_clicks=0),
        html.Div(id="signin-message"),
    ], className="card narrow")


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(Output("auth", "data", allow_duplicate=True), Output("url", "pathname", allow_duplicate=True),
                  Output("signin-message", "children"),
                  Input("signin-submit", "n_clicks"), Input("signin-token", "n_submit"),
                  State("signin-token", "value"), prevent_initial_call=True)
    def _sign_in(_clicks: int, _submit: int, token: str | None):
        token = (token or "").strip()
        if not token:
            raise PreventUpdate
        cfg = current_app.config[APP_CONFIG_KEY]
        try:
            with ApiClient(cfg["api_url"], token, timeout_s=cfg["timeout_s"]) as c:
                scope = c.scope()
        except ApiError as exc:
            return dash.no_update, dash.no_update, error_box(exc if exc.status != 401 else "token refused (401)")
        set_session(dash.callback_context.response, request, token)
        return {"session": fingerprint(token), "scope": scope}, "/" if scope == "operator" else "/jobs", ""


def register_pages() -> None:
    """Add this module's page(s) to dash.page_registry (once per process, after the first app exists)."""
    dash.register_page(__name__, path="/signin", name="Sign in", title="fleetprof · sign in", layout=layout)
