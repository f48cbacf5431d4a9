"""A job sampled on the NVML test double by the real agent code (NvmlDevices -> Sampler) and shipped as the agent's
wire JSON: the server, dashboard and browser tests of issue #20's fields share it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from agent.attribution import Attribution
from agent.devices.fake import FakeNvml
from agent.devices.nvml import HEALTH_EVERY, NvmlDevices
from agent.sampler import Sampler

SM, TENSOR = pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL

# post(path, json_text or dict, token) -> (status, body)
Post = Callable[[str, Any, str], tuple[int, Any]]


def poster(client: Any, prefix: str = "") -> Post:
    """A `Post` through `client`: the in-process app (`api`, prefix "") or httpx against a live server (`httpx`,
    prefix its URL; 60 s a request). A str body is sent as it is (the agent's wire JSON), a dict as JSON."""
    extra: dict[str, Any] = {"timeout": 60} if prefix else {}  # the TestClient takes no timeout

    def post(path: str, body: Any, token: str) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        sent = {"content": body} if isinstance(body, str) else {"json": body}
        r = client.post(f"{prefix}{path}", headers=headers, **sent, **extra)
        return r.status_code, r.json()
    return post


class _NoAttribution:
    def attribute(self, pid: int, gpu_uuid: str | None = None) -> Attribution:
        return Attribution(None, None)

    def forget_except(self, pids: set[int]) -> None:
        pass


def sm_ramp(k: int) -> float:
    """The double's scripted SM activity at reading k (tensor activity: half of it)."""
    return 20.0 + 10.0 * k


def ship_job(post: Post, *, fake: FakeNvml, node: str, agent: str, op: str, job_id: str, t0: float,
             readings: int, sm_of_reading: Callable[[int], float] = sm_ramp,
             script: Callable[[int, FakeNvml], None] | None = None, health_every: int = HEALTH_EVERY) -> None:
    """Register `job_id` on the fake node's GPUs, sample them `readings` times 1 s apart from `t0`, ship the batch
    (labelled source "test", as `fleetprof agent --source fake:N` labels the double's batches) and end the job.
    `script(k, fake)` runs before reading k (a test's scripted change of the double); the health counters are read
    every `health_every` readings, staggered by GPU, as the agent reads them."""
    devices = NvmlDevices(fake, xid_events=False, health_every=health_every)
    devices.source = "test"
    clock = iter(t0 + k for k in range(10_000))
    sampler = Sampler(devices, node=node, agent_id=f"{node}-{job_id}", attributor=_NoAttribution(),  # type: ignore[arg-type]
                      clock=lambda: next(clock))
    uuids = [g.uuid for g in fake.gpus]
    status, body = post("/api/v1/jobs", {"job_id": job_id, "team": "vision", "node": node, "gpu_uuids": uuids,
                                         "started_at": t0, "state": "running"}, op)
    assert status in (200, 201), body
    for k in range(readings):
        for g in fake.gpus:
            g.gpm_metrics[SM], g.gpm_metrics[TENSOR] = sm_of_reading(k), sm_of_reading(k) / 2
        if script is not None:
            script(k, fake)
        sampler.sample()
    batch = sampler.make_batch()
    assert batch is not None
    status, body = post("/api/v1/ingest/samples", batch.model_dump_json(), agent)
    assert status == 200 and body["accepted"] == readings * len(uuids), body
    status, body = post("/api/v1/jobs", {"job_id": job_id, "state": "finished", "ended_at": t0 + readings - 1,
                                         "exit_code": 0}, op)
    assert status in (200, 201), body
    devices.close()
