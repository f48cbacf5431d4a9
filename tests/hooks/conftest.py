"""A recording stand-in for the collector's ingest endpoint, and a helper to run a script under the hooks."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.hooks import child_env

SCRIPTS = Path(__file__).parent / "scripts"


@dataclass
class Recorder:
    url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    # gzip uploads (traces): (path with query, the JSON document inside)
    uploads: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        evs = [e for b in self.bodies for e in b.get("events", [])]
        return [e for e in evs if kind is None or e["kind"] == kind]


@pytest.fixture()
def recorder() -> Iterator[Recorder]:
    rec = Recorder(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            if self.headers.get("Content-Type") == "application/gzip":  # a trace upload: kept apart from events
                with lock:
                    rec.uploads.append((self.path, json.loads(gzip.decompress(raw))))
                reply = json.dumps({"created": True}).encode()
            else:
                body = json.loads(raw)
                with lock:
                    rec.bodies.append(body)
                    rec.paths.append(self.path)
                    rec.auth.append(self.headers.get("Authorization"))
                reply = json.dumps({"accepted": len(body.get("events", [])), "server_time": time.time()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield rec
    server.shutdown()
    server.server_close()


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


def run_script(script: str, *args: str, server_url: str | None, level: str = "default",
               hooks: bool = True, extra_env: dict[str, str] | None = None, cwd: Path | None = None,
               pythonpath: str | None = None, timeout_s: float = 120) -> Run:
    """Run tests/hooks/scripts/<script> in a fresh interpreter, as `fleetprof run` would. `pythonpath` is the
    child's PYTHONPATH before the hooks' own entry; by default this process's (where fleetprof itself may be
    found through it, as on a GPU machine that runs the suite from a checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_") and k != "PYTHONPATH"}
    if pythonpath is None:
        pythonpath = os.environ.get("PYTHONPATH", "")
    if hooks:
        env.update(child_env(job_id="job-hooks-test", server_url=server_url, token="tok-test", level=level,
                             pythonpath=pythonpath))
    elif pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra_env or {})
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), *args], env=env, cwd=cwd or SCRIPTS,
                          capture_output=True, text=True, timeout=timeout_s)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - t0)
