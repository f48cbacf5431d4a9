"""`fleetprof tune power` as a real process against a real `fleetprof server`, sweeping the NVML test double
(`--source fake:1`: no GPU here, the caps are set on the double) over a tiny CPU training script with the hooks
on: every cap is a finished job of the sweep's name, each with its time per step from the hooks' steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import FLEETPROF, client_env

SCRIPT = Path(__file__).parents[1] / "hooks" / "scripts" / "train_cnn.py"


@pytest.mark.slow  # two torch start-ups and a server: ~20 s
def test_tune_power_records_a_sweep(live_server: str, cli_env, make_token) -> None:  # type: ignore[no-untyped-def]
    team = make_token("team", team="e2e-tune")
    env = client_env(cli_env, live_server, team, FLEETPROF_BATCH_INTERVAL_S="0.2")
    out = subprocess.run([*FLEETPROF, "tune", "power", "--source", "fake:1", "--caps", "300,250", "--name",
                          "tiny-tune", "--", sys.executable, str(SCRIPT), "6"],
                         env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "test double" in out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:1] in (["300"], ["250"])]
    assert [r[0] for r in rows] == ["300", "250"], out.stdout
    for _cap, recorded, time_step, _energy, state, job_id in rows:
        assert recorded == "-"  # the double's caps never reach a separate agent's samples
        assert state == "finished" and float(time_step) > 0, out.stdout  # from the job's report (hooks' steps)
        r = httpx.get(f"{live_server}/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {team}"},
                      timeout=10)
        assert r.status_code == 200 and r.json()["name"] == "tiny-tune" and r.json()["state"] == "finished"
    # so right-sizing still asks for a measurement
    assert "recommendation: Power cap needs measuring" in out.stdout
