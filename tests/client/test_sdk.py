"""The SDK against a live server (a real `fleetprof server` process on Postgres): a job's typed report, its
right-sizing, and an estimate, as a scheduler's script gets them; and the example script that uses them.

References are independent of the code under test: the report's peak memory is the largest value this test sent,
the estimate's parameter count the model's own count (torch), its peak at least the fp32 weights, gradients and
two AdamW moments of those parameters."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetprof.client import ApiError, Client
from fleetprof.report import JobReport
from tests.server.helpers import sample_batch

NODE = "sdk-node"
SMALL_RESNET = "server.estimate.zoo:resnet_small"


def _wait_for_report(api: Client, job_id: str, timeout_s: float = 60.0) -> JobReport:
    """The report once it covers the finished job (characterized on demand or by the worker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = api.report(job_id, refresh=True)
        if report.state == "finished" and report.memory.peak_used_bytes is not None:
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"no report of the finished job within {timeout_s} s: {report}")
        time.sleep(0.5)


def test_report_and_rightsizing_of_a_job(live_server: str, make_token) -> None:  # type: ignore[no-untyped-def]
    t0 = time.time() - 600
    batch = sample_batch(node=NODE, agent_id="sdk-agent", gpus=1, n=60, t0=t0)
    gpu = batch["gpus"][0]["uuid"]
    job = {"job_id": "sdk-1", "team": "vision", "name": "sdk-nightly", "node": NODE, "state": "running",
           "started_at": t0, "gpu_uuids": [gpu], "batch_size": 32}
    with Client(live_server, make_token("team", team="vision")) as team, \
            Client(live_server, make_token("agent", node=NODE)) as agent:
        agent.register_job(job)  # as the node's Slurm prolog does: an agent binds GPUs to a job
        accepted = agent.ingest_samples(batch)
        assert accepted.get("duplicate") is not True
        agent.register_job({"job_id": "sdk-1", "state": "finished", "ended_at": t0 + 60, "exit_code": 0})

        report = _wait_for_report(team, "sdk-1")
        assert isinstance(report, JobReport) and report.job_id == "sdk-1" and report.team == "vision"
        assert report.memory.peak_used_bytes == max(batch["samples"]["memory_used_bytes"])
        assert [g.uuid for g in report.gpus] == [gpu] and report.gpus[0].samples == 60
        assert report.model_dump(mode="json", by_alias=True)["job_id"] == team.report_json("sdk-1")["job_id"]

        by_job = team.rightsizing("sdk-1")
        assert by_job["job_id"] == "sdk-1" and "sdk-1" in by_job["history_job_ids"]
        by_name = team.rightsizing(name="sdk-nightly")
        assert by_name["name"] == "sdk-nightly" and "sdk-1" in by_name["history_job_ids"]

        listed = team.jobs(team="vision")
        assert [j["job_id"] for j in listed["items"]] == ["sdk-1"] and listed["total"] == 1
        with pytest.raises(ApiError) as err:
            team.report("no-such-job")
        assert err.value.status == 404
        with pytest.raises(ApiError) as err:
            agent.report("sdk-1")  # agent tokens write, never read reports
        assert err.value.status == 403
    with Client(live_server, "fp_not-a-token") as stranger, pytest.raises(ApiError) as err:
        stranger.jobs()
    assert err.value.status == 401


@pytest.mark.slow
def test_estimate_through_the_scheduler_admission_example(live_server: str, make_token, repo_root: Path,  # type: ignore[no-untyped-def]
                                                         cli_env: dict[str, str]) -> None:
    """The example is the SDK's estimate call (Client.from_settings, Client.estimate) as a scheduler runs it; one
    estimate, since each takes seconds (the server builds the model in a sandboxed child)."""
    from server.estimate.zoo import resnet_small

    parameters = sum(p.numel() for p in resnet_small().parameters())
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("scheduler")}
    script = [sys.executable, str(repo_root / "examples" / "scheduler_admission.py"), "--factory", SMALL_RESNET,
              "--input", "3,32,32", "--batch-size", "4", "--gpu", "T4"]
    r = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    decision = json.loads(r.stdout)
    assert decision["decision"] == "admit" and decision["gpu"] == "T4" and decision["batch_size"] == 4
    assert decision["parameter_count"] == parameters
    assert decision["peak_allocated_bytes"] >= 4 * 4 * parameters  # fp32 weights, grads, two AdamW moments
    assert decision["peak_allocated_bytes"] <= decision["peak_reserved_bytes"] <= decision["device_total_bytes"]

    refused = subprocess.run(script, env={**env, "FLEETPROF_TOKEN": "fp_nope"}, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "401" in refused.stderr
    unset = subprocess.run(script, env={k: v for k, v in env.items() if k != "FLEETPROF_TOKEN"},
                           capture_output=True, text=True, timeout=120)
    assert unset.returncode == 2 and "FLEETPROF_TOKEN" in unset.stderr
