"""Issue #19 acceptance: live captures of a running `fleetprof run` job, on request and automatically.

Real processes throughout: a `fleetprof server` on the suite's Postgres, `fleetprof run` starting a plain PyTorch CPU
script (tests/e2e/scripts/train_slowing.py) with the hooks on, `fleetprof capture` asking for a trace while it runs,
and, in one variant, a local `fleetprof agent` (NVML test double) beside it. The job is never restarted (the script
prints its pid once), its step count in the report is the script's, and the capture's trace is analyzed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import FLEETPROF, client_env, stop_process

SCRIPT = Path(__file__).parent / "scripts" / "train_slowing.py"


def _get(url: str, token: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{url}/api/v1{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _wait(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _start(env: dict[str, str], job_id: str, *script_args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*FLEETPROF, "run", "--job-id", job_id, "--name", "capture-e2e", "--", sys.executable,
                             str(SCRIPT), *script_args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _steps_seen(url: str, token: str, job_id: str) -> int:
    r = _get(url, token, f"/jobs/{job_id}/report", refresh="true")
    return (r.json()["time"]["steps"] or 0) if r.status_code == 200 else 0


@pytest.mark.slow
@pytest.mark.parametrize("with_agent", [False, True], ids=["hooks-only", "with-local-agent"])
def test_a_running_job_is_captured_on_request(live_server: str, cli_env, make_token, tmp_path: Path,
                                              with_agent: bool) -> None:
    team = make_token("team", team="capture")
    job_id = f"capture-live-{'agent' if with_agent else 'hooks'}"
    env = client_env(cli_env, live_server, team, FLEETPROF_HOOKS_CAPTURE_POLL_S="0.5")
    agent = None
    if with_agent:
        agent = subprocess.Popen(
            [*FLEETPROF, "agent", "--server", live_server, "--token", make_token("agent", node="capture-node"),
             "--source", "fake:1", "--interval", "0.5", "--spool", str(tmp_path / "spool"), "--node", "capture-node"],
            env=cli_env, stdout=open(tmp_path / "agent.log", "w"), stderr=subprocess.STDOUT)
    steps = 400
    run = _start(env, job_id, str(steps), "0.04")
    try:
        _wait(lambda: _steps_seen(live_server, team, job_id) >= 20, 90, "the job's first steps")
        cli = subprocess.run([*FLEETPROF, "capture", job_id, "--kind", "kineto", "--steps", "5"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        analyzed = _wait(lambda: [c for c in _get(live_server, team, f"/jobs/{job_id}/captures").json()["captures"]
                                  if c["state"] in ("analyzed", "failed")], 90, "the capture to be analyzed")
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            stop_process(run)
        if agent is not None:
            stop_process(agent)
    [capture] = analyzed
    assert capture["state"] == "analyzed", capture
    assert capture["kind"] == "kineto" and capture["steps"] == 5 and capture["trigger"]["kind"] == "manual"
    assert capture["trace_ids"] and capture["delivered_at"] and capture["capturing_at"] and capture["uploaded_at"]
    assert run.returncode == 0, err[-3000:]
    assert out.count("PID ") == 1 and f"STEP {steps - 1}" in out  # one process, never restarted, ran to the end
    report = _get(live_server, team, f"/jobs/{job_id}/report", refresh="true").json()
    assert report["time"]["steps"] == steps  # the capture cost no step events
    [listed] = [c for c in report["captures"]["captures"] if c["capture_id"] == capture["capture_id"]]
    assert listed["state"] == "analyzed"


@pytest.mark.slow
def test_a_step_time_regression_gets_one_automatic_capture_an_hour(live_server: str, cli_env, make_token) -> None:
    team = make_token("team", team="capture")
    env = client_env(cli_env, live_server, team, FLEETPROF_HOOKS_CAPTURE_POLL_S="0.5")
    # baseline 0.03 s per step; 2x slower from step 120; 4x from step 260 (a second slowdown within the hour)
    run = _start(env, "capture-auto", "360", "0.03", "120", "2.0", "260", "4.0")
    try:
        out, err = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            stop_process(run)
    assert run.returncode == 0, err[-3000:]
    captures = _wait(lambda: [c for c in _get(live_server, team, "/jobs/capture-auto/captures").json()["captures"]
                              if c["state"] in ("analyzed", "failed", "uploaded")] or None, 60,
                     "the automatic capture")
    everything = _get(live_server, team, "/jobs/capture-auto/captures").json()["captures"]
    assert len(everything) == 1, everything  # the second slowdown, within the hour, asked for none
    [capture] = captures
    trigger = capture["trigger"]
    assert trigger["kind"] == "step_time_regression" and "step" in trigger["summary"]
    assert capture["state"] == "analyzed", capture
