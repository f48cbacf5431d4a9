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
from urllib.parse import parse_qs, urlsplit

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
    # live capture requests (issue #19), as the server keeps them: capture_id -> Capture (a subset of its fields)
    captures: dict[str, dict[str, Any]] = field(default_factory=dict)
    capture_polls: list[str] = field(default_factory=list)  # GET .../captures paths with their query
    state_posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (capture_id, body), in order
    poll_status: int | None = None  # answer capture polls with this error status instead

    def add_capture(self, kind: str, steps: int, ranks: list[int] | None = None) -> str:
        cid = f"cap-{len(self.captures) + 1}"
        self.captures[cid] = {"capture_id": cid, "job_id": "job-hooks-test", "kind": kind, "steps": steps,
                              "ranks": ranks, "state": "requested", "reason": None, "trace_ids": [],
                              "trigger": {"kind": "manual", "summary": "test"}}
        return cid

    def states(self, capture_id: str) -> list[str]:
        return [b["state"] for cid, b in list(self.state_posts) if cid == capture_id]

    def wait(self, cond: Any, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.05)
        return False

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        evs = [e for b in self.bodies for e in b.get("events", [])]
        return [e for e in evs if kind is None or e["kind"] == kind]


@pytest.fixture()
def recorder() -> Iterator[Recorder]:
    rec = Recorder(url="")
    lock = threading.Lock()

    # allowed transitions of a capture's state, as the contract has them
    moves = {"requested": {"delivered", "failed"}, "delivered": {"capturing", "failed"},
             "capturing": {"failed"}, "uploaded": {"failed"}}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: Any) -> None:
            reply = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def do_GET(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            if not url.path.endswith("/captures"):
                self._reply(404, {"detail": "not found"})
                return
            with lock:
                rec.capture_polls.append(self.path)
                if rec.poll_status is not None:
                    self._reply(rec.poll_status, {"detail": f"status {rec.poll_status} (test)"})
                    return
                state = parse_qs(url.query).get("state", [None])[0]
                caps = [dict(c) for c in reversed(list(rec.captures.values()))  # newest first
                        if state is None or c["state"] == state]
            self._reply(200, {"captures": caps})

        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            url = urlsplit(self.path)
            if url.path.endswith("/state") and "/captures/" in url.path:
                cid = url.path.split("/")[-2]
                body = json.loads(raw)
                with lock:
                    rec.state_posts.append((cid, body))
                    cap = rec.captures.get(cid)
                    if cap is None:
                        self._reply(404, {"detail": "no such capture"})
                        return
                    if body.get("state") not in moves.get(cap["state"], set()) or (
                            body["state"] == "failed" and not body.get("reason")):
                        self._reply(409, {"detail": f"{cap['state']} -> {body.get('state')}"})
                        return
                    cap["state"], cap["reason"] = body["state"], body.get("reason")
                    reply_cap = dict(cap)
                self._reply(200, reply_cap)
                return
            if self.headers.get("Content-Type") == "application/gzip":  # a trace upload: kept apart from events
                cid = parse_qs(url.query).get("capture_id", [None])[0]
                with lock:
                    rec.uploads.append((self.path, json.loads(gzip.decompress(raw))))
                    if cid in rec.captures:
                        rec.captures[cid]["state"] = "uploaded"
                        rec.captures[cid]["trace_ids"].append(len(rec.uploads))
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


def script_env(server_url: str | None, *, level: str = "default", extra_env: dict[str, str] | None = None,
               pythonpath: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_") and k != "PYTHONPATH"}
    if pythonpath is None:
        pythonpath = os.environ.get("PYTHONPATH", "")
    env.update(child_env(job_id="job-hooks-test", server_url=server_url, token="tok-test", level=level,
                         pythonpath=pythonpath))
    env.update(extra_env or {})
    return env


def start_script(script: str, *args: str, server_url: str, extra_env: dict[str, str] | None = None
                 ) -> subprocess.Popen[str]:
    """Start tests/hooks/scripts/<script> under the hooks and leave it running (for live capture requests)."""
    return subprocess.Popen([sys.executable, str(SCRIPTS / script), *args], cwd=SCRIPTS, text=True,
                            env=script_env(server_url, extra_env=extra_env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


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
