"""POST /api/v1/estimate imports no code a request names (issue 15, item 1: `subprocess:getoutput` ran a command
on the collector): only Hugging Face configs, the built-in zoo and factories an operator registered with
`fleetprof models add`; those run in the sandbox (tests/estimate/test_sandbox.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.helpers import auth

REGISTERED = "tests.estimate.factories:mlp"
BODY = {"inputs": [{"shape": [64]}], "batch_size": 8, "gpu_types": ["T4"], "search_max_batch": False}


def _hostile(marker: Path) -> dict[str, dict[str, object]]:
    """Factories that would each create `marker` if imported and called with these kwargs."""
    touch = f"touch {marker}"
    return {
        "os:system": {"command": touch},
        "subprocess:getoutput": {"cmd": touch},
        "subprocess:run": {"args": ["touch", str(marker)]},
        "subprocess:Popen": {"args": ["touch", str(marker)]},
        "builtins:eval": {},
        "builtins:exec": {},
        "pty:spawn": {"argv": ["touch", str(marker)]},
        "tests.estimate.factories:sandbox_probe": {"check": "spawn", "path": str(marker)},  # importable, not registered
    }


def _models(cli_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetprof.cli", "models", *args], env=cli_env, capture_output=True,
                          text=True, timeout=120)


def test_request_named_code_is_refused_and_nothing_runs(api, make_token, tmp_path):
    team, sched = make_token("team", team="vision"), make_token("scheduler")
    marker = tmp_path / "rce-marker"
    for token in (team, sched):
        for factory, kwargs in _hostile(marker).items():
            body = {**BODY, "model": {"factory": factory, "kwargs": kwargs}}
            r = api.post("/api/v1/estimate", json=body, headers=auth(token), params={"timeout_s": 30})
            assert r.status_code == 422, (factory, r.status_code, r.text)
            assert "not registered" in r.json()["detail"] and "fleetprof estimate --local" in r.json()["detail"]
            assert not marker.exists(), f"{factory} ran"
    # a Hugging Face config names no code either
    remote = {"model_type": "gpt2", "auto_map": {"AutoModelForCausalLM": "attacker/repo--modeling.Model"}}
    r = api.post("/api/v1/estimate", json={**BODY, "model": {"hf_config": remote}, "seq_len": 8}, headers=auth(team))
    assert r.status_code == 422 and "auto_map" in r.text


@pytest.mark.slow
def test_registered_factory_end_to_end(api, make_token, cli_env):
    """`fleetprof models add` (the real CLI on this session's database), then the estimate through the API; removed,
    it is refused again. The standard library cannot be registered."""
    team = make_token("team", team="vision")
    body = {**BODY, "model": {"factory": REGISTERED, "kwargs": {"width": 64}}}
    assert api.post("/api/v1/estimate", json=body, headers=auth(team)).status_code == 422

    r = _models(cli_env, "add", REGISTERED, "--description", "test MLP")
    assert r.returncode == 0, r.stderr
    assert REGISTERED in _models(cli_env, "list").stdout
    r = api.post("/api/v1/estimate", json=body, headers=auth(team), params={"timeout_s": 240})
    assert r.status_code == 200, r.text
    assert r.json()["parameter_count"] == 2 * (64 * 64 + 64) + 64 * 10 + 10 and r.json()["gpus"][0]["fits"]

    assert _models(cli_env, "remove", REGISTERED).returncode == 0
    assert api.post("/api/v1/estimate", json=body, headers=auth(team)).status_code == 422

    for refused in ("subprocess:getoutput", "os:system", "builtins:eval", "mypkg.models:os.system", "x:_private"):
        r = _models(cli_env, "add", refused)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "error" in r.stderr, (refused, r.stderr)
    assert "subprocess" not in _models(cli_env, "list").stdout
