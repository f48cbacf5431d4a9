"""An in-test HTTP double of the collector: validates batches, de-duplicates by (agent_id, seq), and can be
switched down (connection refused), to answering 503/429 with Retry-After, or to losing acknowledgements."""

from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleetprof.protocol import SampleBatch


class Collector:
    def __init__(self) -> None:
        self.batches: dict[tuple[str, int], SampleBatch] = {}
        self.jobs: list[dict[str, Any]] = []
        self.requests = 0
        self.duplicates = 0
        self.status: int | None = None  # answer every ingest with this status (e.g. 503)
        self.retry_after: str | None = None
        self.lose_acks = 0  # commit, then drop the connection without answering, this many times
        self.clock_offset_s = 0.0  # server clock = real clock + offset
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.port = 0

    # ------------------------------------------------------------------------------------------ control

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                collector._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------------------------------------ views

    def rows(self) -> list[tuple[str, float]]:
        """(gpu_uuid, ts) of every stored sample."""
        with self._lock:
            return [(u, t) for b in self.batches.values() for u, t in zip(b.samples.gpu_uuid, b.samples.ts)]

    def wait_for(self, predicate: Any, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    # ------------------------------------------------------------------------------------------ handling

    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length", 0)))
        if h.headers.get("Content-Encoding") == "gzip":
            raw = gzip.decompress(raw)
        with self._lock:
            self.requests += 1
        if h.path == "/api/v1/jobs":
            with self._lock:
                self.jobs.append(json.loads(raw))
            self._reply(h, 200, {"ok": True})
            return
        if h.path != "/api/v1/ingest/samples":
            self._reply(h, 404, {"detail": "not found"})
            return
        if self.status is not None:
            headers = {"Retry-After": self.retry_after} if self.retry_after else None
            self._reply(h, self.status, {"detail": "unavailable"}, headers)
            return
        try:
            batch = SampleBatch.model_validate_json(raw)
        except ValueError as exc:
            self._reply(h, 422, {"detail": str(exc)[:200]})
            return
        key = (batch.agent_id, batch.seq)
        with self._lock:
            duplicate = key in self.batches
            if duplicate:
                self.duplicates += 1
            else:
                self.batches[key] = batch
            lose = self.lose_acks > 0
            if lose:
                self.lose_acks -= 1
        if lose:  # committed, but the agent never hears about it
            h.close_connection = True
            h.connection.shutdown(2)
            return
        self._reply(h, 200, {"accepted": 0 if duplicate else len(batch.samples), "duplicate": duplicate,
                             "server_time": time.time() + self.clock_offset_s})
