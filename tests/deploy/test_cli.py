"""The `fleetprof` console script every deployment runs: each subcommand the deployment files use answers --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("sub", ["server", "worker", "dashboard", "db", "agent", "token"])
def test_console_script_serves_each_deployed_subcommand(sub: str) -> None:
    """The installed `fleetprof` entry point (what every unit, container and compose service runs) answers
    `fleetprof SUB --help` for each subcommand the deployment files use."""
    exe = Path(sys.executable).with_name("fleetprof")
    assert exe.exists(), f"{exe}: the package is not installed with its console script"
    done = subprocess.run([str(exe), sub, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"usage: fleetprof {sub}" in done.stdout


def test_top_level_help_lists_the_deployed_subcommands() -> None:
    exe = Path(sys.executable).with_name("fleetprof")
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for sub in ("server", "worker", "dashboard", "db", "agent", "token"):
        assert f"    {sub} " in done.stdout or f"    {sub}\n" in done.stdout, f"`fleetprof --help` lacks {sub}"
