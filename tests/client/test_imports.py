"""The SDK and the client commands run on the bare install: importing them loads no server, agent or dashboard
code, no web framework, ORM or PyTorch (a scheduler's script carries only pydantic and httpx)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MODULES = ["fleetprof.client", "fleetprof.report", "fleetprof.protocol", "fleetprof.commands.report",
           "fleetprof.commands.rightsizing", "fleetprof.commands.replay", "fleetprof.commands.import_trace",
           "fleetprof.commands.estimate", "fleetprof.cli", "fleetprof.profiling",
           "fleetprof.trackers", "fleetprof.commands.download"]
HEAVY = ("server", "agent", "dashboard", "embedded", "fastapi", "sqlalchemy", "dash", "celery", "torch", "numpy",
         "mlflow", "wandb")


def test_sdk_and_client_commands_import_only_the_bare_package(repo_root: Path) -> None:
    code = ("import importlib, json, sys\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "fleetprof.client" in loaded
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
