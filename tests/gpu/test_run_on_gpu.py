"""A real CUDA training job under `fleetprof run`, sampled by a real `fleetprof agent --source nvml`, reported by a
real server: the allocator's peaks sit under NVML's, and the energy comes from the hardware counter.

Print the figures (`pytest -m gpu -s tests/gpu`) and commit them with the device they came from."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import FLEETPROF, client_env, stop_process
from tests.gpu.test_apply_on_gpu import _evidence

SCRIPT = Path(__file__).resolve().parents[1] / "hooks" / "scripts" / "train_cnn.py"


def test_cuda_job_report_from_nvml_and_hooks(live_server, cli_env, make_token, tmp_path) -> None:
    team = make_token("team", team="gpu")
    agent_token = make_token("agent", node="gpu-node")
    agent = subprocess.Popen([*FLEETPROF, "agent", "--server", live_server, "--token", agent_token, "--source",
                              "nvml", "--interval", "0.5", "--spool", str(tmp_path / "spool"), "--node", "gpu-node"],
                             env=cli_env, stdout=open(tmp_path / "agent.log", "w"), stderr=subprocess.STDOUT)
    try:
        time.sleep(3)  # the agent registered its GPUs and shipped a first batch
        env = client_env(cli_env, live_server, team)
        run = subprocess.run([*FLEETPROF, "run", "--job-id", "gpu-cnn", "--", sys.executable, str(SCRIPT), "3000",
                              "cuda"], env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        time.sleep(3)  # the last samples shipped
    finally:
        stop_process(agent)
    headers = {"Authorization": f"Bearer {team}"}
    report = httpx.get(f"{live_server}/api/v1/jobs/gpu-cnn/report", params={"refresh": "true"}, headers=headers,
                       timeout=120).json()
    _evidence("cnn_report.json", report)
    mem, energy = report["memory"], report["energy"]
    print("gpu report:", {k: mem[k] for k in ("peak_used_bytes", "peak_allocated_bytes", "peak_reserved_bytes")},
          {k: energy[k] for k in ("energy_j", "source", "mean_power_w")}, report["time"]["steps"],
          [g["name"] for g in report["gpus"]])
    assert report["time"]["steps"] == 3000
    assert report["gpus"], (tmp_path / "agent.log").read_text()[-3000:]
    assert 0 < mem["peak_allocated_bytes"] <= mem["peak_reserved_bytes"] <= mem["peak_used_bytes"]
    assert energy["source"] == "hardware_counter" and energy["energy_j"] > 0
