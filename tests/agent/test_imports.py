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
