"""Acceptance (issue #20): a replayed multi-GPU recording where one GPU is thermally throttled for part of the run
and holds the others back. replay -> ingest -> characterize -> report, through the CLI and a real server.

The recording and its truth come from tests/synthetic/generate_health.py (the throttle schedule written there, not
read back from fleetprof's analyzers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SYNTHETIC = Path(__file__).resolve().parents[1] / "synthetic"
SLOWDOWNS = {"thermal", "power_cap", "hw_slowdown"}


def _fleetprof(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetprof.cli", *args], env=env, capture_output=True, text=True,
                          timeout=180)


@pytest.fixture
def client_env(cli_env, live_server, make_token):
    return {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("operator")}


def _replayed_report(client_env: dict[str, str], name: str, job: str) -> dict:
    r = _fleetprof(["replay", str(SYNTHETIC / f"{name}.jsonl"), "--job-id", job, "--node", "synthetic-health",
                    "--batch-steps", "100"], client_env)
    assert r.returncode == 0, r.stderr
    r = _fleetprof(["report", job, "--format", "json"], client_env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_throttled_gpu_is_named_throttled_and_the_straggler(client_env):
    truth = json.loads((SYNTHETIC / "throttled_straggler.truth.json").read_text())
    report = _replayed_report(client_env, "throttled_straggler", "health-throttled")
    assert report["state"] == "finished" and len(report["gpus"]) == 4
    findings = report["health"]["findings"]
    slow = [f for f in findings if f["kind"] in SLOWDOWNS]
    # only the throttled GPU has a slowdown finding, and only the thermal one (its peers' idle bits are not)
    assert [(f["gpu_uuid"], f["kind"]) for f in slow] == [(truth["straggler_uuid"], "thermal")]
    thermal = slow[0]
    assert thermal["seconds"] == pytest.approx(truth["throttled_s"], rel=0.10)
    assert thermal["fraction"] == pytest.approx(truth["throttled_s"] / truth["duration_s"], rel=0.10)
    assert thermal["since_ts"] == pytest.approx(truth["first_throttled_ts"], abs=2.0)
    assert thermal["episodes"] == len(truth["throttle_intervals_s"])
    assert thermal["sm_clock_drop_pct"] == pytest.approx(truth["sm_clock_drop_pct"], abs=1.0)
    assert thermal["sm_clock_reference_source"] == "catalogue:H100-80GB"
    assert "-29 %" in thermal["summary"]
    stragglers = report["time"]["stragglers"]
    assert stragglers["source"] == "nvml" and stragglers["gpus"] == 4
    named = [s for s in stragglers["stragglers"] if s.get("gpu_uuid")]
    assert [s["gpu_uuid"] for s in named] == [truth["straggler_uuid"]]
    straggler = named[0]
    assert straggler["likely_cause"] == "thermal throttling"
    # the throttled compute phase is max/throttled clock = 1.41x as long as its peers'
    assert 0.2 < straggler["slowdown_fraction"] < 0.6
    # while it straggled an iteration lasted its compute + the all-reduce; its peers were busy compute + all-reduce
    assert straggler["median_step_s"] == pytest.approx(truth["throttled_period_s"], rel=0.05)
    assert straggler["busy_phase_s"] == pytest.approx(truth["throttled_period_s"], rel=0.05)
    assert straggler["peer_busy_phase_s"] == pytest.approx(truth["normal_period_s"], rel=0.05)
    first, last = truth["throttle_intervals_s"][0][0], truth["throttle_intervals_s"][-1][1]
    start = truth["first_throttled_ts"] - first
    assert start + first - straggler["window_s"] <= straggler["since_ts"] <= start + first + straggler["window_s"]
    assert straggler["until_ts"] <= start + last + straggler["window_s"]
    # the terminal view lists the finding under [health]
    table = _fleetprof(["report", "health-throttled"], client_env)
    assert table.returncode == 0, table.stderr
    health = table.stdout.split("[health]", 1)[1]
    assert f"{truth['straggler_uuid']}  thermal (warning): thermal slowdown: SM clock -29 %" in health


def test_idle_bits_are_never_slowdowns(client_env):
    truth = json.loads((SYNTHETIC / "idle_bits.truth.json").read_text())
    report = _replayed_report(client_env, "idle_bits", "health-idle")
    assert report["gpus"][0]["uuid"] == truth["gpu_uuid"]
    assert report["health"]["gpus_checked"] == 1
    assert report["health"]["findings"] == []
