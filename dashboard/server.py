"""Serve the dashboard in a thread, stoppable: `fleetprof up` runs it beside the collector."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading

from dashboard.config import DashboardSettings
from fleetprof.ports import listen

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve_dashboard(host: str, port: int, api_url: str, token: str | None, stop: threading.Event,
                    sock: socket.socket | None = None) -> None:
    """Serve until `stop` is set, on `sock` when the caller bound it already (`fleetprof up` binds before it prints
    the link), else on a socket bound here (a port in use: CliError). `token` becomes the default for visitors who
    have not signed in only when the dashboard listens on loopback; on any other address each visitor signs in (the
    printed link carries it)."""
    # Lazy: Dash and werkzeug are the dashboard extra and take ~1 s to import, and this module is imported by the
    # CLI's parser (`fleetprof --help` imports every command module) and by `fleetprof up` without the extra.
    from werkzeug.serving import make_server

    from dashboard.app import create_dash_app
    from dashboard.session import RedactingRequestHandler

    sock = sock or listen(host, port, "dashboard", "--port")
    settings = DashboardSettings()
    default_token = token if _is_loopback(host) else None
    app = create_dash_app(api_url, default_token, refresh_s=settings.dashboard_refresh_s,
                          timeout_s=settings.dashboard_api_timeout_s)
    # The access log redacts tokens: a link with ?token= (exchanged for a cookie at once) still reaches it once.
    with sock:  # werkzeug serves a duplicate of it
        server = make_server(host, port, app.server, threaded=True, fd=sock.fileno(),
                             request_handler=RedactingRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="dashboard-http", daemon=True)
    thread.start()
    log.info("dashboard on http://%s:%d (API %s)", host, port, api_url)
    try:
        stop.wait()
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
