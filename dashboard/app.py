"""The Dash application factory: multi-page, data only through the REST API.

The browser holds the token in an HttpOnly session cookie (dashboard/session.py); every callback builds its API
client from the cookie of its request, so the dashboard process keeps no per-user state. `/?token=...` is exchanged
for that cookie before any page is served, and redirected to the address without it. The `auth` store (session
storage, readable by page scripts) holds only the token's scope and a fingerprint of it, never the token.
"""

from __future__ import annotations

import importlib

import dash
from dash import Input, Output, State, dcc, html
from dash._callback_context import context_value
from dash.exceptions import PreventUpdate
from flask import request

from dashboard.client import ApiClient, ApiError
from dashboard.components import APP_CONFIG_KEY, is_operator
from dashboard.downloads import install_downloads
from dashboard.session import AuthStore, clear_session, fingerprint, install_token_exchange, request_token

PAGE_MODULES = ("signin", "fleet", "nodes", "jobs", "job", "estimate", "compare")


def create_dash_app(api_url: str, token: str | None = None, *, refresh_s: float = 60.0,
                    timeout_s: float = 30.0):
    """Build the dashboard for the API at `api_url`.

    `token`, when given, is used by visitors who have not signed in: only for a single-user dashboard.
    """
    app = dash.Dash(__name__, use_pages=True, pages_folder="", suppress_callback_exceptions=True,
                    # None keeps the tab title while callbacks run: Dash's docstring allows it, its annotation says str
                    title="fleetprof", update_title=None, serve_locally=True)  # type: ignore[arg-type]
    default_scope = None
    if token:
        try:
            with ApiClient(api_url, token, timeout_s=timeout_s) as c:
                default_scope = c.scope()
        except ApiError:
            default_scope = None  # refused or unreachable now: treated as a reader until someone signs in
    app.server.config[APP_CONFIG_KEY] = {"api_url": api_url.rstrip("/"), "default_token": token,
                                         "default_scope": default_scope, "timeout_s": timeout_s,
                                         "refresh_s": refresh_s}
    _ensure_dash_context()
    _install_security_headers(app.server)
    install_token_exchange(app.server)
    install_downloads(app.server)
    for name in PAGE_MODULES:  # pages: once per process (a global registry); callbacks: once per app
        module = importlib.import_module(f"dashboard.pages.{name}")
        if module.__name__ not in dash.page_registry:
            module.register_pages()
        module.register_callbacks(app)

    app.layout = html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        dcc.Store(id="auth", storage_type="session"),
        html.Header([
            dcc.Link("fleetprof", href="/", className="brand"),
            html.Nav(id="nav"),
            html.Div([html.Span(id="whoami", className="whoami"),
                      html.Button("Sign out", id="signout", n_clicks=0, className="link-button")],
                     className="session"),
        ], className="topbar"),
        html.Main(dash.page_container, className="content"),
    ])

    @app.callback(Output("auth", "data"), Input("url", "pathname"), State("auth", "data"))
    def _session_from_cookie(_path: str | None, auth: AuthStore | None):
        """The store follows the session cookie: its scope once per token (for the navigation), nothing without."""
        supplied = request_token()
        if not supplied:
            if auth:
                return None
            raise PreventUpdate
        session = fingerprint(supplied)
        if auth and auth.get("session") == session:
            raise PreventUpdate
        try:
            with ApiClient(api_url, supplied, timeout_s=timeout_s) as c:
                scope = c.scope()
        except ApiError as exc:
            if exc.status != 401:
                return {"session": session, "scope": None}  # unreachable now: a reader until it answers
            clear_session(dash.callback_context.response)  # a refused token signs out, no stale session
            return None
        return {"session": session, "scope": scope}

    @app.callback(Output("auth", "data", allow_duplicate=True), Output("url", "pathname", allow_duplicate=True),
                  Input("signout", "n_clicks"), prevent_initial_call=True)
    def _sign_out(n: int):
        if not n:
            raise PreventUpdate
        clear_session(dash.callback_context.response)
        return None, "/signin"

    @app.callback(Output("nav", "children"), Output("whoami", "children"), Output("signout", "style"),
                  Input("auth", "data"))
    def _nav(auth: AuthStore | None):
        session = auth.get("session") if auth else None
        signed_in = bool(session) or bool(token)
        operator = is_operator(auth)
        links = [("Fleet", "/"), ("Nodes", "/nodes")] if operator else []
        links += [("Jobs", "/jobs"), ("Estimator", "/estimate")]
        nav = [dcc.Link(label, href=href, className="nav-link", id=f"nav-{label.lower()}") for label, href in links]
        if not signed_in:
            return [dcc.Link("Sign in", href="/signin", className="nav-link", id="nav-signin")], "not signed in", \
                {"display": "none"}
        who = "operator" if operator else "team / scheduler token"
        if not session:
            who += " (dashboard default)"
        return nav, f"signed in: {who}", {}

    return app


def _ensure_dash_context() -> None:
    """dash.register_page reads Dash's callback-context variable, which only has a value in the thread that
    imported dash; `fleetprof up` builds the app in a thread of its own."""
    try:
        context_value.get()
    except LookupError:
        context_value.set({})


# No CORS headers are sent: the dashboard and its callbacks are same-origin only. The token lives in session
# storage, so the page must not be framed by another origin (clickjacking) nor leak its URL (?token=) as referrer.
# Pages and callback answers (which carry data) are never stored; the JavaScript bundles carry none, and
# storing them spares every page 4.8 MB of plotly.js fetched and compiled again (~0.5 s a page): they are
# revalidated by their ETag instead, unless Dash gave them a longer lifetime itself (fingerprinted names).
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC_PREFIXES = ("/_dash-component-suites/", "/assets/")


def _install_security_headers(server) -> None:
    @server.after_request
    def _headers(response):
        static = request.path.startswith(STATIC_PREFIXES)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, "no-cache" if static and name == "Cache-Control" else value)
        return response
