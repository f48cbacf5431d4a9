"""deploy/systemd: the units parse, and every ExecStart runs a real `fleetprof` command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.deploy.common import DEPLOY, parse_fleetprof, unit_file

UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


def _expand(value: str, env: dict[str, str]) -> str:
    """systemd's ${VAR} / $VAR expansion in Exec lines, from the unit's Environment= defaults."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), "1"), value)


def _exec_lines(unit: dict) -> list[list[str]]:
    service = unit["Service"]
    env = {}
    for key, value in service:
        if key == "Environment":
            for assignment in shlex.split(value):
                k, _, v = assignment.partition("=")
                env[k] = v
    return [shlex.split(_expand(value.lstrip("-@:+!"), env)) for key, value in service
            if key in ("ExecStart", "ExecStartPre", "ExecStartPost")]


def test_control_plane_units_exist() -> None:
    names = {p.name for p in UNITS}
    assert {"fleetprof-server.service", "fleetprof-worker.service", "fleetprof-beat.service",
            "fleetprof-agent.service"} <= names


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_unit_parses_and_runs_fleetprof(path: Path) -> None:
    unit = unit_file(path)
    assert {"Unit", "Service", "Install"} <= set(unit), f"{path.name}: sections {set(unit)}"
    keys = dict(unit["Service"])
    assert keys.get("Restart") in ("always", "on-failure")
    lines = _exec_lines(unit)
    assert lines, f"{path.name} has no ExecStart"
    for argv in lines:
        assert argv[0].startswith("/"), f"{path.name}: Exec paths must be absolute: {argv[0]}"
        parse_fleetprof(argv)


def _commands(name: str) -> list:
    return [parse_fleetprof(a) for a in _exec_lines(unit_file(DEPLOY / "systemd" / name))]


def test_server_unit_migrates_before_serving() -> None:
    pre, serve = _commands("fleetprof-server.service")
    assert (pre.command, pre.db_command) == ("db", "upgrade")
    assert serve.command == "server" and serve.host == "0.0.0.0"
    assert dict(unit_file(DEPLOY / "systemd" / "fleetprof-server.service")["Service"]).get("User") not in (None, "root")


def test_only_the_beat_unit_runs_beat() -> None:
    beats = [p.name for p in UNITS for a in _commands(p.name) if getattr(a, "beat", False)]
    assert beats == ["fleetprof-beat.service"]
    (worker,) = _commands("fleetprof-worker.service")
    assert worker.command == "worker" and not worker.beat

