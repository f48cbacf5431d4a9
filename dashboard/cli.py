"""`fleetprof dashboard [--host H] [--port P] [--server URL]`: serve the Dash dashboard."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from dashboard.config import DashboardSettings
from dashboard.server import serve_dashboard
from fleetprof.ports import listen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="bind address (default FLEETPROF_DASHBOARD_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default FLEETPROF_DASHBOARD_PORT or 8050)")
    parser.add_argument("--server", default=None, help="API base URL (default FLEETPROF_SERVER_URL)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per API call is noise here
    settings = DashboardSettings()
    host = args.host or settings.dashboard_host
    port = args.port or settings.dashboard_port
    api_url = args.server or settings.server_url
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sock = listen(host, port, "dashboard", "--port")  # a port in use: one line, exit 2, before the banner
    print(f"fleetprof dashboard on http://{host}:{port}  (API {api_url}; sign in with a token at /signin)",
          flush=True)
    serve_dashboard(host, port, api_url, settings.token, stop, sock)
    return 0
