"""Smoke test of `fleetprof up` as a new user runs it: a real process, embedded default (SQLite under ./.fleetprof
of a fresh working directory, no FLEETPROF_* settings), free ports, the local agent replaying the recorded H100
capture (this machine has no GPU), Ctrl-C (SIGINT) stops everything cleanly.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil

from tests.conftest import free_port
from tests.e2e.conftest import FLEETPROF, pids_alive


def _read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float) -> tuple[re.Match[str], str]:
    """Read the process's output line by line until `pattern` matches; returns the match and all output."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        out.append(line)
        m = re.search(pattern, line)
        if m:
            return m, "".join(out)
    raise AssertionError(f"no {pattern!r} in the output of fleetprof up (exit {proc.poll()}):\n{''.join(out)}")


def test_up_embedded_serves_replay_and_stops_on_sigint(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a hung stop can be made to print every thread's stack (SIGABRT, below)
    port, dash_port = free_port(), free_port()
    proc = subprocess.Popen([*FLEETPROF, "up", "--port", str(port), "--dashboard-port", str(dash_port)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[int] = []
    try:
        m, banner = _read_until(proc, r"operator token: (\S+)", timeout_s=90)
        token = m.group(1)
        api = f"http://127.0.0.1:{port}"
        assert api in banner and f"http://127.0.0.1:{dash_port}/" in banner, banner
        assert "REPLAY" in banner and "not live" in banner, banner  # the replay is labelled as such
        assert (tmp_path / ".fleetprof").is_dir()  # embedded storage in the working directory
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]

        headers = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 30
        gpus: list[dict] = []
        while time.monotonic() < deadline and not gpus:
            r = httpx.get(f"{api}/api/v1/gpus", params={"node": "local-replay"}, headers=headers, timeout=5)
            assert r.status_code == 200, r.text
            gpus = [g for g in r.json() if g.get("last_seen_at")]
            time.sleep(1)
        assert gpus, "the local agent's replay did not reach the collector within 30 s"
        assert any("H100" in (g.get("name") or "") for g in gpus), gpus
        job = httpx.get(f"{api}/api/v1/jobs/demo-replay", headers=headers, timeout=5)
        assert job.status_code == 200, job.text
        assert job.json()["metadata"].get("replay") is True
        # The recording's processes (gpu_burn and two memhogs, unattributed in the capture) are the demo job's.
        mem: dict = {}
        while time.monotonic() < deadline + 30 and not mem.get("job_processes"):
            mem = httpx.get(f"{api}/api/v1/jobs/demo-replay/report", params={"refresh": "true"}, headers=headers,
                            timeout=30).json()["memory"]
            time.sleep(1)
        assert mem["job_processes"] >= 1 and mem["process_peak_bytes"] > 0, mem
        assert all(p["job_id"] == "demo-replay" and p["attribution"] == "replay" for p in mem["processes"]), mem
        assert httpx.get(f"http://127.0.0.1:{dash_port}/", timeout=30).status_code == 200
    finally:
        # the rest of the output is read while it stops, so a full pipe can never hold it up
        tail: list[str] = []
        reader = threading.Thread(target=lambda: tail.extend(proc.stdout or []), daemon=True)
        reader.start()
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack into the output
            proc.wait(10)
            reader.join(5)
            raise AssertionError("fleetprof up did not stop within 40 s of SIGINT; its threads:\n"
                                 + "".join(tail)[-8000:]) from None
        reader.join(10)
        rest = "".join(tail)
    assert rc == 0, rest
    assert "fleetprof stopped" in rest
    assert "Traceback" not in rest, rest
    assert pids_alive(children) == []


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a non-interactive shell's background job inherits


def test_up_stops_in_order_on_sigterm_and_on_sigint_it_inherited_ignored(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env["PYTHONUNBUFFERED"] = "1"
    for sig in (signal.SIGTERM, signal.SIGINT):
        port = free_port()
        proc = subprocess.Popen([*FLEETPROF, "up", "--port", str(port), "--no-dashboard", "--no-agent"],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_ignore_sigint)
        try:
            assert proc.stdout is not None
            # the banner arrives at once and nothing follows: read lines (blocking) rather than wait on the pipe
            banner = ""
            for line in iter(proc.stdout.readline, ""):
                banner += line
                if "operator token:" in line:
                    break
            assert "operator token:" in banner, banner
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        assert proc.returncode == 0 and "fleetprof stopped" in out, (sig, proc.returncode, out)
