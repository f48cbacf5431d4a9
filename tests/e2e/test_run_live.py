"""`fleetprof run` as a real process against a real `fleetprof server`: exit statuses and job states.

The commands run with the PyTorch hooks on (the default): the child gets the hooks' sitecustomize, which must
not get in the way of a plain Python command.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.conftest import FLEETPROF, client_env, stop_process


@pytest.fixture
def tokens(make_token) -> dict[str, str]:
    return {"team": make_token("team", team="e2e"), "operator": make_token("operator")}


def _job(url: str, token: str, job_id: str) -> dict:
    r = httpx.get(f"{url}/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _run(url: str, env: dict[str, str], job_id: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--", sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=60)


def test_run_exit_status_and_job_state(live_server: str, cli_env, tokens) -> None:
    env = client_env(cli_env, live_server, tokens["team"])

    failed = _run(live_server, env, "e2e-run-exit3", "import sys; sys.exit(3)")
    assert failed.returncode == 3, failed.stderr
    job = _job(live_server, tokens["operator"], "e2e-run-exit3")
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["team"] == "e2e"
    assert job["ended_at"] is not None
    # a job with no GPU telemetry still has a report: its state, and nulls where nothing can be known
    r = httpx.get(f"{live_server}/api/v1/jobs/e2e-run-exit3/report",
                  headers={"Authorization": f"Bearer {tokens['team']}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "failed" and r.json()["memory"]["peak_used_bytes"] is None

    ok = _run(live_server, env, "e2e-run-ok", "import time; time.sleep(0.3); print('trained')")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "trained"
    job = _job(live_server, tokens["operator"], "e2e-run-ok")
    assert job["state"] == "finished" and job["exit_code"] == 0
    assert job["duration_s"] is not None and job["duration_s"] >= 0.3
    assert job["ended_at"] >= job["started_at"]
    assert "time.sleep" in job["command"]


def test_run_killed_by_sigterm_is_marked_killed(live_server: str, cli_env, tokens) -> None:
    env = client_env(cli_env, live_server, tokens["team"])
    proc = subprocess.Popen([*FLEETPROF, "run", "--job-id", "e2e-run-term", "--", sys.executable, "-c",
                             "import time; time.sleep(120)"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:  # registered as running before we stop it
            r = httpx.get(f"{live_server}/api/v1/jobs/e2e-run-term",
                          headers={"Authorization": f"Bearer {tokens['operator']}"}, timeout=10)
            if r.status_code == 200 and r.json()["state"] == "running":
                break
            assert time.monotonic() < deadline, "the job was never registered as running"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        time.sleep(0.5)  # let the child start
        rc = stop_process(proc, signal.SIGTERM, timeout_s=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert rc == 128 + signal.SIGTERM, err  # like a shell: 143
    job = _job(live_server, tokens["operator"], "e2e-run-term")
    assert job["state"] == "killed", job
    assert job["exit_code"] == 128 + signal.SIGTERM
    assert job["duration_s"] > 0
