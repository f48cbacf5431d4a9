"""`fleetprof estimate --local`: a team's own model code, estimated in its own process (the server would refuse
it), and the result stored with its job through the existing POST /api/v1/jobs (metadata.estimate)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.helpers import auth

OWN_MODEL = '''
from torch import nn


def tiny(width: int = 32) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
'''


@pytest.mark.slow
def test_local_estimate_of_own_code_and_upload(cli_env, live_server, make_token, tmp_path: Path) -> None:
    (tmp_path / "team_models.py").write_text(OWN_MODEL)
    team = make_token("team", team="vision")
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": team}
    args = [sys.executable, "-m", "fleetprof.cli", "estimate", "--factory", "team_models:tiny", "--input", "32",
            "--batch-size", "4", "--gpu", "T4", "--no-search", "--format", "json"]

    r = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 6 and "not registered" in r.stderr and "--local" in r.stderr  # the server refuses it (422)

    r = subprocess.run([*args, "--local", "--job-id", "vision-local-1"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    est = json.loads(r.stdout)
    assert est["model_name"] == "team_models:tiny" and est["parameter_count"] == 32 * 32 + 32 + 32 * 10 + 10
    assert "stored with job vision-local-1" in r.stderr

    job = httpx.get(f"{live_server}/api/v1/jobs/vision-local-1", headers=auth(team), timeout=30).json()
    assert job["team"] == "vision"
    stored = job["metadata"]["estimate"]
    assert stored["source"] == "fleetprof estimate --local" and stored["gpus"] == est["gpus"]
    other = make_token("team", team="audio")
    assert httpx.get(f"{live_server}/api/v1/jobs/vision-local-1", headers=auth(other), timeout=30).status_code in (
        403, 404)

    r = subprocess.run([*args[:-2], "--job-id", "x"], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--local" in r.stderr


def test_local_estimate_loads_no_server_framework(repo_root: Path) -> None:
    """--local (embedded/estimate.py) imports the estimator only, never FastAPI, SQLAlchemy or Celery."""
    code = ("import json, sys\n"
            "from embedded.estimate import estimate_locally\n"
            "est = estimate_locally({'model': {'factory': 'server.estimate.zoo:resnet_small'}, 'inputs': "
            "[{'shape': [3, 32, 32]}], 'batch_size': 2, 'gpu_types': ['T4'], 'search_max_batch': False}, 60)\n"
            "print(json.dumps([est['parameter_count'], sorted(sys.modules)]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    params, loaded = json.loads(r.stdout.splitlines()[-1])
    assert params > 0
    assert not [m for m in loaded if m.split(".")[0] in ("fastapi", "sqlalchemy", "celery", "dash", "psycopg2")]
