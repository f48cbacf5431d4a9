"""`fleetprof up` and `fleetprof dashboard` with a port already taken (issue 14.7): one line and exit 2, before any
banner. The dashboard's port used to end only the dashboard's thread (werkzeug's sys.exit) while the banner printed
"fleetprof is up" and a link carrying the operator token to whatever held the port."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import FLEETPROF


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def run_fleetprof(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}  # embedded, in tmp_path
    return subprocess.run([*FLEETPROF, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize(("option", "what"), [("--dashboard-port", "dashboard"), ("--port", "collector")])
def test_up_with_a_port_taken_is_one_line_and_no_banner(option, what, taken_port, tmp_path):
    ports = {"--port": str(free_port()), "--dashboard-port": str(free_port()), option: str(taken_port)}
    res = run_fleetprof(tmp_path, "up", "--no-agent", *[x for kv in ports.items() for x in kv])
    assert res.returncode == 2, res.stdout + res.stderr
    assert "fleetprof is up" not in res.stdout and "token" not in res.stdout + res.stderr, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"the {what} could not start on 127.0.0.1:{taken_port}" in lines[0] and option in lines[0], lines[0]
    assert not (tmp_path / ".fleetprof").exists()  # refused before it migrated or created tokens


def test_dashboard_with_its_port_taken_is_one_line(taken_port, tmp_path):
    res = run_fleetprof(tmp_path, "dashboard", "--port", str(taken_port))
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stdout + res.stderr
    assert "already in use" in res.stderr and "--port" in res.stderr, res.stderr
