"""The agent's metrics endpoint: `GET /metrics` on FLEETPROF_AGENT_METRICS_PORT, the latest readings as
rendered by `NodeGauges` (no NVML call per scrape). A standard-library threading HTTP server on a daemon thread:
the agent carries no web framework."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.exporter.gauges import CONTENT_TYPE, NodeGauges

log = logging.getLogger(__name__)


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection between scrapes
    # headers and body leave in two writes; with Nagle on, the body waited for the client's delayed ACK (~40 ms a
    # scrape, bench/agent_exporter.py)
    disable_nagle_algorithm = True
    timeout = 30.0  # an idle or stalled connection is closed; it holds a thread (Prometheus reconnects)

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, self.server.gauges.render(), CONTENT_TYPE)
        elif path in ("/", "/healthz"):
            self._answer(200, b"fleetprof agent: GPU metrics at /metrics\n", "text/plain; charset=utf-8")
        else:
            self._answer(404, b"not found: GPU metrics are at /metrics\n", "text/plain; charset=utf-8")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's signature
        log.debug("metrics %s - " + format, self.address_string(), *args)


class MetricsPortError(ValueError):
    """The metrics port cannot be listened on (in use, no permission, bad address)."""


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    @classmethod
    def bind(cls, host: str, port: int, gauges: NodeGauges) -> MetricsServer:
        try:
            return cls(host, port, gauges)
        except OSError as exc:
            raise MetricsPortError(f"cannot serve metrics on {host}:{port} (FLEETPROF_AGENT_METRICS_PORT): "
                                   f"{exc.strerror or exc}") from None

    def __init__(self, host: str, port: int, gauges: NodeGauges):
        super().__init__((host, port), _Handler)
        self.gauges = gauges
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="fleetprof-metrics", daemon=True)
        self._thread.start()
        log.info("GPU metrics for Prometheus at http://%s:%d/metrics", self.server_address[0], self.port)

    def close(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
        self.server_close()
