"""A Kubernetes pod's process, all the way: attribution through the kubelet pod-resources API -> the real agent's
batches -> ingest on a live `fleetprof server` -> `GET /api/v1/jobs/{id}`, the report, the CLI -> the dashboard's
link to the job and its page (in Chromium: tests/dashboard/test_k8s_job_page.py). The job id is
`k8s:ml/trainer-0`: its '/' once stopped the agent (issue 14.5)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.attribution import Attributor
from agent.config import AgentSettings
from agent.daemon import Agent
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from fleetprof.jobid import job_path
from tests.agent.test_attribution import POD_UID, make_proc
from tests.agent.test_podresources import GPU_A, LIST_ANSWER, Kubelet
from tests.server.helpers import auth

JOB = "k8s:ml/trainer-0"  # LIST_ANSWER: pod trainer-0 of namespace ml holds GPU_A
PID = 4242
USED_BYTES = 3 << 30
FLEETPROF = [sys.executable, "-m", "fleetprof.cli"]


@pytest.fixture
def pod_on_a_node(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A node's /proc with a pod's process, and the kubelet's pod-resources socket: (proc root, socket)."""
    proc = tmp_path / "proc"
    make_proc(proc, PID, cgroup=f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-1.scope\n")
    sock = tmp_path / "kubelet.sock"
    kubelet = Kubelet(sock, LIST_ANSWER)
    yield proc, sock
    kubelet.stop()


def run_agent_against(server: str, token: str, proc: Path, sock: Path, spool: Path) -> Agent:
    """The real agent, its GPUs a FakeNvml (the pod's process on GPU_A, nothing on the other), for ~2 s."""
    gpus = [FakeGpu(uuid=GPU_A, compute_processes=[(PID, USED_BYTES)]),
            FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", pci_bus_id="00000000:19:00.0")]
    settings = AgentSettings(server_url=server, token=token, spool_dir=spool, node_name="k8s-node-1",
                             interval_s=0.1, fast_interval_s=0.02, batch_interval_s=0.3, http_timeout_s=5.0,
                             proc_root=proc, pod_resources_socket=sock)
    agent = Agent(settings, NvmlDevices(FakeNvml(gpus)), attributor=Attributor(proc, pod_resources_socket=sock))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    time.sleep(2.0)
    stop.set()
    thread.join(20)
    assert not thread.is_alive()
    return agent


@pytest.fixture
def k8s_job(live_server: str, make_token, pod_on_a_node, tmp_path: Path) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    proc, sock = pod_on_a_node
    agent = run_agent_against(live_server, make_token("agent", node="k8s-node-1"), proc, sock, tmp_path / "spool")
    assert agent.samples_spooled >= 20 and len(agent.spool) == 0  # everything it sampled was acknowledged
    assert agent.sampler.dropped_rows_total == 0
    return {"operator": make_token("operator"), "agent": agent}


def test_a_pod_from_attribution_to_report_cli_and_dashboard_link(k8s_job, live_server: str, cli_env) -> None:  # type: ignore[no-untyped-def]
    from dashboard.client import ApiClient
    from dashboard.components import job_href, job_link
    from dashboard.pages.job import layout

    h = auth(k8s_job["operator"])
    with httpx.Client(base_url=live_server, headers=h, timeout=60) as api:
        job = api.get(job_path(JOB))
        assert job.status_code == 200, job.text
        assert job.json()["job_id"] == JOB and job.json()["node"] == "k8s-node-1"
        assert job.json()["gpu_uuids"] == [GPU_A]  # the pod's GPU only
        report = api.get(job_path(JOB, "report"))
        assert report.status_code == 200, report.text
        gpus = report.json()["gpus"]
        assert [g["uuid"] for g in gpus] == [GPU_A] and gpus[0]["peak_used_bytes"] > 0
        listed = api.get("/api/v1/jobs", params={"q": "trainer-0"}).json()["items"]
        assert [j["job_id"] for j in listed] == [JOB]

    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": k8s_job["operator"]}
    cli = subprocess.run([*FLEETPROF, "report", JOB, "--format", "json"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["job_id"] == JOB
    cli = subprocess.run([*FLEETPROF, "rightsizing", JOB, "--format", "json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and json.loads(cli.stdout)["job_id"] == JOB, cli.stderr
    bad = subprocess.run([*FLEETPROF, "report", "k8s:ml/../x"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a job id" not in bad.stdout
    assert "dots only" in bad.stderr, bad.stderr

    # The dashboard: the link it draws for the job, the page that link opens, and what that page fetches.
    href = job_href(JOB)
    assert href == "/jobs/k8s:ml%2Ftrainer-0" and job_link(JOB).href == href
    page = layout(job_id=href.removeprefix("/jobs/"))  # the path variable as Dash hands it over
    store = next(c for c in page.children if getattr(c, "id", None) == "job-id")
    assert store.data == JOB
    with ApiClient(live_server, k8s_job["operator"]) as client:  # what the page's data callbacks call
        assert client.job(JOB)["job_id"] == JOB and client.report(JOB).job_id == JOB
        assert client.timeseries_batch(JOB, {"memory_used_bytes": 100})["memory_used_bytes"]["series"]
        assert client.steps(JOB)["job_id"] == JOB
    refused = layout(job_id="a%20b")
    assert "is not a job id" in str(refused)
