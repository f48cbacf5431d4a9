"""deploy/slurm/'s prolog and epilog, run as slurmd runs them (no PATH, the environment Slurm gives a 2-GPU job on
node gpu-node-07: tests/deploy/slurm/*.env) against a live `fleetprof server`: the job is registered with its GPUs,
`fleetprof run` inside the allocation takes its id, the epilog ends it with Slurm's exit status and prints the
summary; and nothing the scripts meet (server down or hanging, no Slurm job) makes them exit non-zero."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleetprof import units
from tests.server.helpers import auth

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "deploy" / "slurm"
RECORDED = Path(__file__).resolve().parent / "slurm"
NODE = "gpu-node-07"
# FLEETPROF_SOURCE=fake:2: the prolog reads this node's GPUs through the agent's device layer, here its NVML double
FAKE_UUIDS = [f"GPU-fake{i:04d}-0000-0000-0000-000000000000" for i in range(2)]


def slurm_env(name: str, **fill: object) -> dict[str, str]:
    env = {}
    for line in (RECORDED / name).read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            for k, v in fill.items():
                value = value.replace(f"@{k}@", str(v))
            env[key] = value
    return env


def settings_file(tmp_path: Path, **settings: str) -> Path:
    """The scripts' /etc/fleetprof/slurm.env."""
    base = {"FLEETPROF_NODE_NAME": NODE, "FLEETPROF_SOURCE": "fake:2",
            "FLEETPROF_BIN": f"{sys.executable} -m fleetprof.cli", "FLEETPROF_DASHBOARD_URL": "http://dash.example:8050",
            "FLEETPROF_SLURM_LOG": "",
            "PYTHONPATH": str(REPO_ROOT)}
    path = tmp_path / "slurm.env"
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in {**base, **settings}.items()))
    return path


def run_script(name: str, env: dict[str, str], config: Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPTS / name)], env={**env, "FLEETPROF_SLURM_ENV": str(config)},
                          capture_output=True, text=True, timeout=timeout_s)


def agent_samples(job_id: str, t0: float, *, seq: int) -> dict:
    """What the node's agent sends while the job runs: 2 GPUs x 20 samples 0.1 s apart, the job's processes on both."""
    from fleetprof.protocol import PROTOCOL_VERSION

    ts, gpu, mem, util, power = [], [], [], [], []
    for k in range(20):
        for i, uuid in enumerate(FAKE_UUIDS):
            ts.append(t0 + 0.1 * k), gpu.append(uuid), mem.append((20_000 + 100 * k + i) * 2**20)
            util.append(50.0 + 20 * i), power.append(300.0)
    return {"protocol_version": PROTOCOL_VERSION, "node": NODE, "agent_id": "agent-07", "seq": seq,
            "sent_at": time.time(), "source": "test",
            "gpus": [{"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * 2**20}
                     for i, u in enumerate(FAKE_UUIDS)],
            "samples": {"ts": ts, "gpu_uuid": gpu, "memory_used_bytes": mem, "gpu_util_pct": util, "power_w": power},
            "processes": {"ts": ts, "gpu_uuid": gpu, "pid": [7000 + i % 2 for i in range(len(ts))],
                          "used_memory_bytes": mem, "job_id": [job_id] * len(ts),
                          "attribution": ["env:SLURM_JOB_ID"] * len(ts)}}


@pytest.fixture
def tokens(make_token):  # type: ignore[no-untyped-def]
    return {"agent": make_token("agent", node=NODE), "scheduler": make_token("scheduler"),
            "operator": make_token("operator"), "team": make_token("team", team="vision")}


def _job(url: str, job_id: str, token: str) -> dict:
    r = httpx.get(f"{url}/api/v1/jobs/{job_id}", headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()


def _run_job_on_the_node(url: str, job_id: str, tokens: dict[str, str]) -> None:
    """The agent's samples of the job, inside its window (from the prolog's start to the epilog's end)."""
    started = _job(url, job_id, tokens["operator"])["started_at"]
    r = httpx.post(f"{url}/api/v1/ingest/samples", json=agent_samples(job_id, started + 0.05, seq=int(started)),
                   headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    time.sleep(max(0.0, started + 2.1 - time.time()))


@pytest.mark.slow
def test_prolog_run_and_epilog_of_a_2_gpu_job(live_server, tokens, cli_env, tmp_path) -> None:
    config = settings_file(tmp_path, FLEETPROF_SERVER_URL=live_server, FLEETPROF_TOKEN=tokens["agent"],
                           FLEETPROF_SLURM_REPORT_TOKEN=tokens["scheduler"])
    out = tmp_path / "slurm-4242.out"
    out.write_text("epoch 1 ...\n")
    fill = dict(JOBID=4242, UID=os.getuid(), GID=os.getgid(), OUT=out, WORK=tmp_path)

    r = run_script("prolog.sh", slurm_env("prolog.env", **fill), config)
    assert r.returncode == 0 and "error" not in r.stderr.lower(), r.stderr
    job = _job(live_server, "slurm:4242", tokens["operator"])
    assert job["state"] == "running" and job["team"] == "vision" and job["user"] == "alice"
    assert job["node"] == NODE and job["gpu_uuids"] == FAKE_UUIDS and job["gpus_requested"] == 2
    assert job["metadata"]["slurm_partition"] == "gpu"

    # The user's command inside the allocation: `fleetprof run` takes slurm:$SLURM_JOB_ID on its own.
    run = subprocess.run([sys.executable, "-m", "fleetprof.cli", "run", "--no-hooks", "--", sys.executable, "-c", "0"],
                         env={**cli_env, "SLURM_JOB_ID": "4242", "FLEETPROF_SERVER_URL": live_server,
                              "FLEETPROF_TOKEN": tokens["team"]}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "job id slurm:4242" in run.stderr, run.stderr
    _run_job_on_the_node(live_server, "slurm:4242", tokens)

    r = run_script("epilog.sh", slurm_env("epilog.env", **fill, RAW=0, EXIT2="0:0", DERIVED=0), config)
    assert r.returncode == 0, r.stderr
    job = _job(live_server, "slurm:4242", tokens["operator"])
    assert job["state"] == "finished" and job["exit_code"] == 0 and job["metadata"]["slurm_exit_code2"] == "0:0"
    assert job["end_reason"] is None

    summary = r.stdout
    report = httpx.get(f"{live_server}/api/v1/jobs/slurm:4242/report", headers=auth(tokens["scheduler"])).json()
    assert "fleetprof summary of Slurm job 4242 (slurm:4242)" in summary
    assert "State:               finished (exit code 0, Slurm ExitCode 0:0)" in summary
    assert "GPUs:                2 x NVIDIA H100 80GB HBM3" in summary
    gpu_hours = float(re.search(r"GPU-hours:\s+([0-9.e-]+) GPU-h", summary).group(1))  # type: ignore[union-attr]
    assert gpu_hours == pytest.approx(report["duration_s"] * 2 / 3600, rel=0.01)
    assert report["memory"]["peak_used_bytes"] == (20_000 + 1900 + 1) * 2**20  # the largest one-GPU peak
    assert (f"Peak GPU memory:     {units.size((20_000 + 1901) * 2**20)} of {units.size(81559 * 2**20)} "
            f"({100 * 21901 / 81559:.1f} %)") in summary
    assert f"Mean GPU util:       {units.pct(report['utilization']['gpu_mean_pct'])}" in summary
    assert report["energy"]["energy_j"] is not None
    assert f"Energy:              {units.energy(report['energy']['energy_j'])} (" in summary
    assert "Report:              http://dash.example:8050/jobs/slurm%3A4242" in summary
    # ... and appended to the job's own output, where the user reads it
    assert out.read_text().startswith("epoch 1 ...\n\nfleetprof summary of Slurm job 4242")


@pytest.mark.slow
def test_a_job_killed_by_a_signal_and_an_output_that_is_a_symlink(live_server, tokens, tmp_path) -> None:
    config = settings_file(tmp_path, FLEETPROF_SERVER_URL=live_server, FLEETPROF_TOKEN=tokens["agent"],
                           FLEETPROF_SLURM_REPORT_TOKEN=tokens["scheduler"])
    victim = tmp_path / "not-the-jobs"
    victim.write_text("keep\n")
    out = tmp_path / "slurm-4243.out"
    out.symlink_to(victim)  # the job's user pointed its output elsewhere: root must not write through it
    fill = dict(JOBID=4243, UID=os.getuid(), GID=os.getgid(), OUT=out, WORK=tmp_path)
    assert run_script("prolog.sh", slurm_env("prolog.env", **fill), config).returncode == 0
    _run_job_on_the_node(live_server, "slurm:4243", tokens)
    # scancel / the time limit: SIGKILL; wait(2) status 9
    r = run_script("epilog.sh", slurm_env("epilog.env", **fill, RAW=9, EXIT2="0:9", DERIVED=9), config)
    assert r.returncode == 0, r.stderr
    job = _job(live_server, "slurm:4243", tokens["operator"])
    assert job["state"] == "killed" and job["exit_code"] == 137
    assert job["metadata"]["slurm_exit_code2"] == "0:9" and job["metadata"]["slurm_derived_exit_code"] == "0:9"
    assert "State:               killed (signal 9, Slurm ExitCode 0:9; worst step 0:9)" in r.stdout
    assert "summary not appended to the job's output" in r.stderr and victim.read_text() == "keep\n"

    # a failing script (exit 3) under an agent token alone: ended, and the summary says the figures need a token
    config = settings_file(tmp_path, FLEETPROF_SERVER_URL=live_server, FLEETPROF_TOKEN=tokens["agent"])
    fill["JOBID"] = 4244
    assert run_script("prolog.sh", slurm_env("prolog.env", **fill), config).returncode == 0
    r = run_script("epilog.sh", slurm_env("epilog.env", **fill, RAW=768, EXIT2="3:0", DERIVED=768), config)
    assert r.returncode == 0
    assert _job(live_server, "slurm:4244", tokens["operator"])["state"] == "failed"
    assert "State:               failed (exit code 3" in r.stdout and "Figures:             unavailable" in r.stdout


def test_nothing_fails_the_slurm_job(tmp_path) -> None:
    """Server down, server hanging past the time limit, no Slurm job in the environment, no fleetprof installed:
    exit 0 every time (a failing prolog drains the node), with the reason on stderr."""
    env = slurm_env("prolog.env", JOBID=77, UID=os.getuid(), GID=os.getgid(), OUT=tmp_path / "o", WORK=tmp_path)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}"
    r = run_script("prolog.sh", env, settings_file(tmp_path, FLEETPROF_SERVER_URL=down, FLEETPROF_TOKEN="fp_x"))
    assert r.returncode == 0 and "the job is not affected" in r.stderr, r.stderr

    with socket.socket() as hanging:  # accepts connections (the backlog), never answers
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(8)
        config = settings_file(tmp_path, FLEETPROF_SERVER_URL=f"http://127.0.0.1:{hanging.getsockname()[1]}",
                               FLEETPROF_TOKEN="fp_x", FLEETPROF_SLURM_TIMEOUT_S="2")
        t0 = time.monotonic()
        r = run_script("epilog.sh", slurm_env("epilog.env", JOBID=77, UID=0, GID=0, OUT="", WORK=tmp_path, RAW=0,
                                              EXIT2="0:0", DERIVED=0), config)
        assert r.returncode == 0 and time.monotonic() - t0 < 9 and "exited 124" in r.stderr, r.stderr

    r = run_script("epilog.sh", {}, settings_file(tmp_path, FLEETPROF_SERVER_URL=down))
    assert r.returncode == 0 and "not a Slurm job id" in r.stderr, r.stderr
    r = run_script("prolog.sh", env, settings_file(tmp_path, FLEETPROF_BIN=str(tmp_path / "no-such-fleetprof")))
    assert r.returncode == 0 and "exited 127" in r.stderr, r.stderr
