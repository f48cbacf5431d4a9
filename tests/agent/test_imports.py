"""The agent never imports the server or the dashboard (GPU nodes carry no FastAPI, SQLAlchemy or Dash)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MODULES = ["agent.devices.base", "agent.devices.nvml", "agent.devices.fake", "agent.devices.replay",
           "agent.attribution", "agent.spool", "agent.shipper", "agent.sampler", "agent.daemon", "agent.run",
           "agent.cli.agent", "agent.cli.run"]


def test_agent_imports_no_server_or_dashboard(repo_root: Path) -> None:
    code = ("import importlib, json, sys\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    bad = [m for m in loaded if m.split(".")[0] in ("server", "dashboard", "fastapi", "sqlalchemy", "dash",
                                                    "celery", "torch")]
    assert not bad, bad


FRAMEWORKS = ("keras", "tensorflow", "jax", "jaxlib", "torch")
CORE = ["fleetprof.cli", "fleetprof.client", "fleetprof.protocol", "fleetprof.report", "fleetprof.settings",
        "fleetprof.commands.import_trace", "fleetprof.commands.report"]
HOOKS = ["agent.hooks", "agent.hooks.env", "agent.hooks.keras", "agent.hooks.jax", "agent.hooks.device_memory",
         "agent.hooks.events", "agent.hooks.sender"]


def test_core_agent_and_hooks_modules_import_no_framework(repo_root: Path) -> None:
    """Keras, TensorFlow and JAX are optional extras: the core install, the agent and even the Keras/JAX hooks'
    modules import none of them (the hooks are handed the framework the job imported)."""
    code = ("import importlib, json, sys\n"
            f"for m in {CORE + MODULES + HOOKS!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "agent.hooks.keras" in loaded and "agent.hooks.jax" in loaded  # imported, so the check means something
    bad = [m for m in loaded if m.split(".")[0] in FRAMEWORKS]
    assert not bad, bad


def test_node_agent_loads_no_report_or_api_models(repo_root: Path) -> None:
    """The node agent ships batches through fleetprof.client but never reads a report: the report and API models
    (their pydantic schemas, ~2.4 MB of the agent's RSS, whose target is 60 MB) are imported only where used."""
    code = ("import importlib, json, sys\n"
            "for m in ['agent.cli.agent', 'agent.daemon', 'fleetprof.client']: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "fleetprof.client" in loaded and "agent.shipper" in loaded  # imported, so the check means something
    assert "fleetprof.report" not in loaded
    assert "fleetprof.api_models" not in loaded
