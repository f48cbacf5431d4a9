"""POST /api/v1/estimate and `fleetprof estimate`: real estimates in a child process; bad requests are 4xx."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.server.helpers import auth

FACTORIES = ("tests.estimate.factories:mlp", "tests.estimate.factories:raising")


@pytest.fixture
def registered(server_settings):
    """The test factories registered, as `fleetprof models add` does (tests/security/test_estimate_sandbox.py
    runs that command itself)."""
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.estimate.registry import add_model

    engine = make_engine(server_settings)
    with session_scope(make_sessionmaker(engine)) as session:
        for factory in FACTORIES:
            add_model(session, factory=factory)
    engine.dispose()

MLP = {"model": {"factory": "tests.estimate.factories:mlp", "kwargs": {"width": 256, "depth": 3}},
       "inputs": [{"shape": [256]}], "batch_size": 32, "optimizer": "adam", "gpu_types": ["T4", "H100-80GB"],
       "search_max_batch": False}


@pytest.mark.slow
def test_estimate_api_and_bad_requests(api, make_token, registered):
    sched = make_token("scheduler")
    r = api.post("/api/v1/estimate", json=MLP, headers=auth(sched))
    assert r.status_code == 200, r.text
    est = r.json()
    params = 3 * (256 * 256 + 256) + 256 * 10 + 10
    assert est["parameter_count"] == params
    # weights + grads + two Adam moments, in fp32, must all be live at the peak
    assert est["peak_allocated_bytes"] >= 4 * 4 * params
    assert {g["gpu"] for g in est["gpus"]} == {"T4", "H100-80GB"} and all(g["fits"] for g in est["gpus"])

    bad = {
        "unknown model": ({**MLP, "model": {"factory": "no.such.module:fn"}}, "unknown_model"),
        "factory raises": ({**MLP, "model": {"factory": "tests.estimate.factories:raising"}}, "model_build_failed"),
        "shape mismatch": ({**MLP, "inputs": [{"shape": [7]}]}, "input_mismatch"),
        "absurd batch": ({**MLP, "batch_size": 10**9}, ""),
        "unknown gpu": ({**MLP, "gpu_types": ["Z9000"]}, "unknown_gpu"),
    }
    for case, (body, kind) in bad.items():
        r = api.post("/api/v1/estimate", json=body, headers=auth(sched))
        assert r.status_code == 422, (case, r.text)
        assert kind in json.dumps(r.json()), (case, r.text)
    assert api.post("/api/v1/estimate", json=MLP, headers=auth(make_token("agent", node="n"))).status_code == 403
    assert api.post("/api/v1/estimate", json=MLP).status_code == 401


@pytest.mark.slow
def test_estimate_cli(cli_env, live_server, make_token, registered):
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("team", team="t")}
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "estimate", "--factory", "tests.estimate.factories:mlp",
                        "--input", "64", "--batch-size", "16", "--gpu", "T4", "--no-search"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "T4" in r.stdout and "peak allocated" in r.stdout and "GiB" in r.stdout
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "estimate", "--factory", "x:y", "--input", "a,b",
                        "--batch-size", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "comma-separated integers" in r.stderr
