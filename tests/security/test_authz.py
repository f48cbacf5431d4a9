"""Issue 15, defects 2 and 3: reading another team's telemetry, writing across nodes.

Each test failed on the code before the fix (checked): a team token attached another team's GPUs to a job of its
own and read their series, created nodes and GPUs of its own invention, stretched its job over another team's time
on a shared GPU, read other jobs' ids in its processes table; an agent token bound to one node wrote steps and
traces into jobs of another node.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleetprof.protocol import PROTOCOL_VERSION
from tests.server.helpers import auth

MIB = 2**20
KINETO = (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
          b'"ts": 1000, "dur": 50, "args": {"device": 0, "stream": 7}}]}')


def telemetry(*, node: str, seq: int, t0: float, n: int, mem_mib: int, job_id: str | None, gpu: int = 0,
              pid: int = 100) -> dict[str, Any]:
    """`n` seconds of one GPU of `node` at `mem_mib` MiB used; its process attributed to `job_id` by the agent."""
    uuid = f"GPU-{node}-{gpu}"
    ts = [t0 + k for k in range(n)]
    batch: dict[str, Any] = {
        "protocol_version": PROTOCOL_VERSION, "node": node, "agent_id": f"agent-{node}", "seq": seq,
        "sent_at": time.time(), "source": "test",
        "gpus": [{"uuid": uuid, "index": gpu, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * MIB}],
        "samples": {"ts": ts, "gpu_uuid": [uuid] * n, "memory_used_bytes": [mem_mib * MIB] * n,
                    "power_w": [100.0] * n},
    }
    if job_id is not None:
        batch["processes"] = {"ts": ts, "gpu_uuid": [uuid] * n, "pid": [pid] * n,
                              "used_memory_bytes": [mem_mib * MIB] * n, "job_id": [job_id] * n,
                              "attribution": ["env:FLEETPROF_JOB_ID"] * n}
    return batch


def post_ok(api, path: str, token: str, body: Any) -> Any:  # type: ignore[no-untyped-def]
    r = api.post(path, json=body, headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()


def series_values(api, token: str, job_id: str) -> set[float]:  # type: ignore[no-untyped-def]
    r = api.get(f"/api/v1/jobs/{job_id}/timeseries", params={"metric": "memory_used_bytes"}, headers=auth(token))
    assert r.status_code == 200, r.text
    return {v for s in r.json()["series"] for v in s["values"]}


@pytest.fixture
def beta_on_n2(api, make_token):  # type: ignore[no-untyped-def]
    """Team beta's job on GPU 0 of node n2, 60 s at 777 MiB, attributed by n2's agent; tokens of every kind."""
    tokens = {"alpha": make_token("team", team="alpha"), "beta": make_token("team", team="beta"),
              "n1": make_token("agent", node="n1"), "n2": make_token("agent", node="n2"),
              "op": make_token("operator")}
    t0 = time.time() - 600
    post_ok(api, "/api/v1/jobs", tokens["beta"], {"job_id": "b-job", "team": "beta", "state": "running",
                                                   "started_at": t0})
    post_ok(api, "/api/v1/ingest/samples", tokens["n2"], telemetry(node="n2", seq=1, t0=t0, n=60, mem_mib=777,
                                                                     job_id="b-job"))
    post_ok(api, "/api/v1/jobs", tokens["beta"], {"job_id": "b-job", "state": "finished", "ended_at": t0 + 59})
    assert series_values(api, tokens["beta"], "b-job") == {777 * MIB}
    return {**tokens, "t0": t0}


def test_a_team_cannot_attach_another_teams_gpus(api, beta_on_n2):
    t = beta_on_n2
    r = api.post("/api/v1/jobs", headers=auth(t["alpha"]), json={
        "job_id": "a-spy", "team": "alpha", "node": "n2", "gpu_uuids": ["GPU-n2-0"], "state": "finished",
        "started_at": t["t0"] - 10, "ended_at": t["t0"] + 70})
    assert r.status_code == 403, r.text
    assert "b-job" not in r.text and "beta" not in r.text
    # Nothing of it was kept: the job exists with no GPUs, or not at all; either way no telemetry of beta.
    r = api.get("/api/v1/jobs/a-spy/timeseries", params={"metric": "memory_used_bytes"}, headers=auth(t["alpha"]))
    assert r.status_code == 404 or r.json()["series"] == []
    # An operator may say so.
    post_ok(api, "/api/v1/jobs", t["op"], {"job_id": "a-ok", "team": "alpha", "node": "n2",
                                           "gpu_uuids": ["GPU-n2-0"], "started_at": t["t0"], "ended_at": t["t0"] + 59})
    assert series_values(api, t["alpha"], "a-ok") == {777 * MIB}


def test_a_team_may_attach_gpus_its_agent_attributed_to_it(api, beta_on_n2):
    t = beta_on_n2
    body = post_ok(api, "/api/v1/jobs", t["beta"], {"job_id": "b-job", "node": "n2", "gpu_uuids": ["GPU-n2-0"]})
    assert body["gpu_uuids"] == ["GPU-n2-0"]
    assert series_values(api, t["beta"], "b-job") == {777 * MIB}


def test_a_team_cannot_create_nodes_or_gpus(api, beta_on_n2):
    t = beta_on_n2
    for node, uuid in (("phantom", "GPU-phantom-0"), ("n2", "GPU-n2-99")):
        r = api.post("/api/v1/jobs", headers=auth(t["alpha"]), json={
            "job_id": f"a-{node}", "node": node, "gpu_uuids": [uuid]})
        assert r.status_code == 403, r.text
    nodes = api.get("/api/v1/nodes", headers=auth(t["op"])).json()
    assert "phantom" not in str(nodes)
    gpus = api.get("/api/v1/gpus", headers=auth(t["op"])).json()
    assert "GPU-n2-99" not in str(gpus) and "GPU-phantom-0" not in str(gpus)


def test_a_team_cannot_stretch_its_job_over_another_teams_time(api, beta_on_n2):
    # Alpha ran on the same GPU before beta (attributed by the agent), then moved its end past beta's run.
    t = beta_on_n2
    t0 = t["t0"] - 200
    post_ok(api, "/api/v1/jobs", t["alpha"], {"job_id": "a-job", "team": "alpha", "state": "running",
                                              "started_at": t0})
    post_ok(api, "/api/v1/ingest/samples", t["n2"], telemetry(node="n2", seq=2, t0=t0, n=60, mem_mib=333,
                                                                job_id="a-job", pid=200))
    post_ok(api, "/api/v1/jobs", t["alpha"], {"job_id": "a-job", "state": "finished", "ended_at": t["t0"] + 100})
    assert series_values(api, t["alpha"], "a-job") == {333 * MIB}
    report = api.get("/api/v1/jobs/a-job/report", headers=auth(t["alpha"])).json()
    assert report["memory"]["peak_used_bytes"] == 333 * MIB
    assert "b-job" not in str(report)


def test_a_gpu_shared_for_a_while_is_shared_only_that_while(api, beta_on_n2):
    # Alpha's process shared the GPU with beta's for the first 10 s of beta's run, then alpha stretched its end
    # past beta's: beta's samples after alpha's last sighting are beta's alone.
    t = beta_on_n2
    t0 = t["t0"] - 30
    post_ok(api, "/api/v1/jobs", t["alpha"], {"job_id": "a-brief", "team": "alpha", "state": "running",
                                              "started_at": t0})
    batch = telemetry(node="n2", seq=4, t0=t0 + 0.5, n=40, mem_mib=100, job_id="a-brief", pid=400)
    post_ok(api, "/api/v1/ingest/samples", t["n2"], batch)
    post_ok(api, "/api/v1/jobs", t["alpha"], {"job_id": "a-brief", "state": "finished", "ended_at": t["t0"] + 100})
    r = api.get("/api/v1/jobs/a-brief/timeseries", params={"metric": "memory_used_bytes", "points": 10_000},
                headers=auth(t["alpha"]))
    series = r.json()["series"][0]
    beta_seen = [ts for ts, v in zip(series["ts"], series["values"], strict=True) if v == 777 * MIB]
    assert beta_seen and max(beta_seen) <= t0 + 40, (max(beta_seen) - t["t0"])  # shared: [t0, t0 + 10] only


def test_other_jobs_ids_are_not_in_a_jobs_processes(api, beta_on_n2):
    # A GPU shared at the same time: alpha's report counts beta's process and its memory, never names its job.
    t = beta_on_n2
    post_ok(api, "/api/v1/jobs", t["alpha"], {"job_id": "a-shared", "team": "alpha", "state": "running",
                                              "started_at": t["t0"]})
    batch = telemetry(node="n2", seq=3, t0=t["t0"], n=60, mem_mib=100, job_id="a-shared", pid=300)
    batch["samples"] = {**batch["samples"], "ts": [x + 0.5 for x in batch["samples"]["ts"]]}
    batch["processes"]["ts"] = batch["samples"]["ts"]
    post_ok(api, "/api/v1/ingest/samples", t["n2"], batch)
    post_ok(api, "/api/v1/jobs", t["alpha"], {"job_id": "a-shared", "state": "finished", "ended_at": t["t0"] + 60})
    report = api.get("/api/v1/jobs/a-shared/report", headers=auth(t["alpha"])).json()
    assert report["memory"]["other_processes"] == 1
    assert "b-job" not in str(report)


def _events(job_id: str, seq: int) -> dict[str, Any]:
    return {"protocol_version": PROTOCOL_VERSION, "source_id": "hooks", "seq": seq, "sent_at": time.time(),
            "events": [{"kind": "step", "job_id": job_id, "ts": time.time() - 5, "step": seq, "wall_s": 0.1}]}


def test_an_agent_writes_events_and_traces_only_for_its_node(api, beta_on_n2):
    t = beta_on_n2
    r = api.post("/api/v1/ingest/events", json=_events("b-job", 1), headers=auth(t["n1"]))
    assert r.status_code in (403, 404), r.text
    r = api.post("/api/v1/jobs/b-job/traces", content=KINETO, headers=auth(t["n1"]))
    assert r.status_code in (403, 404), r.text
    steps = api.get("/api/v1/jobs/b-job/steps", headers=auth(t["beta"])).json()
    assert steps["count"] == 0
    # Its own node's job it may write to; a job it names first becomes its node's.
    post_ok(api, "/api/v1/ingest/events", t["n2"], _events("b-job", 2))
    post_ok(api, "/api/v1/ingest/events", t["n1"], _events("n1-new", 3))
    assert api.get("/api/v1/jobs/n1-new", headers=auth(t["op"])).json()["node"] == "n1"
    r = api.post("/api/v1/ingest/events", json=_events("n1-new", 4), headers=auth(t["n2"]))
    assert r.status_code in (403, 404), r.text


def test_an_agent_attaches_only_its_own_nodes_gpus(api, beta_on_n2):
    t = beta_on_n2
    r = api.post("/api/v1/jobs", json={"job_id": "n1-job", "node": "n2", "gpu_uuids": ["GPU-n2-0"]},
                 headers=auth(t["n1"]))
    assert r.status_code == 403, r.text
    post_ok(api, "/api/v1/jobs", t["n2"], {"job_id": "n2-job", "node": "n2", "gpu_uuids": ["GPU-n2-0"]})


def test_a_team_cannot_claim_a_job_only_an_agent_has_seen(api, beta_on_n2):
    # The agent knows the job's id (SLURM_JOB_ID), not its team: the first team to name the id must not own it and
    # its telemetry. Its node's agent (the Slurm prolog, with the job's account) or an operator says whose it is.
    t = beta_on_n2
    post_ok(api, "/api/v1/ingest/samples", t["n2"], telemetry(node="n2", seq=5, t0=t["t0"] + 100, n=30, mem_mib=555,
                                                                job_id="slurm:4242", pid=500))
    r = api.post("/api/v1/jobs", json={"job_id": "slurm:4242", "team": "alpha"}, headers=auth(t["alpha"]))
    assert r.status_code in (403, 404), r.text
    assert api.get("/api/v1/jobs/slurm:4242", headers=auth(t["alpha"])).status_code == 404
    steps = {"protocol_version": 1, "source_id": "hooks-x", "seq": 0, "sent_at": t["t0"] + 200,
             "events": [{"kind": "step", "job_id": "slurm:4242", "step": 0, "ts": t["t0"] + 110, "wall_s": 1.0}]}
    assert api.post("/api/v1/ingest/events", json=steps, headers=auth(t["alpha"])).status_code in (403, 404)
    # the operator says whose it is; then that team reads it, and the other still does not
    post_ok(api, "/api/v1/jobs", t["op"], {"job_id": "slurm:4242", "team": "beta"})
    assert api.get("/api/v1/jobs/slurm:4242", headers=auth(t["beta"])).status_code == 200
    assert api.get("/api/v1/jobs/slurm:4242", headers=auth(t["alpha"])).status_code == 404
