"""GET /api/v1/jobs/compare: runs built through ingest, figures checked against each job's own report."""

from __future__ import annotations

import time

import pytest

from fleetprof.protocol import PROTOCOL_VERSION
from tests.server.helpers import auth, sample_batch

JOBS = "/api/v1/jobs"
GIB = 2**30


def _run(api, *, op: str, writer: str, agent: str, job_id: str, team: str, node: str, gpu_name: str, batch: int,
         wall_s: float, power_w: float, mem_gib: float, t0: float, steps: int = 100) -> None:  # type: ignore[no-untyped-def]
    """A finished job on one GPU of `node`: 1 Hz telemetry for `steps * wall_s` s, and hook steps."""
    n = int(steps * wall_s) + 1
    uuid = f"GPU-{node}-0"
    r = api.post(JOBS, json={"job_id": job_id, "name": "resnet50", "team": team, "framework": "pytorch",
                             "node": node, "gpu_uuids": [uuid], "started_at": t0, "state": "running",
                             "batch_size": batch}, headers=auth(op))
    assert r.status_code == 200, r.text
    batch_doc = sample_batch(node=node, agent_id=f"agent-{node}", seq=1, n=n, gpus=1, t0=t0)
    batch_doc["gpus"][0]["name"] = gpu_name
    s = batch_doc["samples"]
    s["memory_used_bytes"] = [int(mem_gib * GIB) - 2**20 * (k % 7) for k in range(n)]
    s["power_w"] = [power_w + (k % 3) for k in range(n)]
    s["gpu_util_pct"] = [90.0] * n
    assert api.post("/api/v1/ingest/samples", json=batch_doc, headers=auth(agent)).status_code == 200
    events = [{"kind": "step", "job_id": job_id, "ts": t0 + (k + 1) * wall_s, "step": k,
               "wall_s": wall_s * (1.0 + 0.01 * (k % 5)), "samples": batch,
               "allocated_peak_bytes": int(mem_gib * 0.6 * GIB), "reserved_peak_bytes": int(mem_gib * 0.8 * GIB)}
              for k in range(steps)]
    r = api.post("/api/v1/ingest/events", json={"protocol_version": PROTOCOL_VERSION, "source_id": f"hooks-{job_id}",
                                                "seq": 1, "sent_at": time.time(), "events": events},
                 headers=auth(writer))
    assert r.status_code == 200, r.text
    r = api.post(JOBS, json={"job_id": job_id, "state": "finished", "ended_at": t0 + n - 1, "exit_code": 0},
                 headers=auth(op))
    assert r.status_code == 200, r.text


@pytest.fixture
def runs(api, make_token):
    op, vision, nlp = make_token("operator"), make_token("team", team="vision"), make_token("team", team="nlp")
    t0 = time.time() - 3600
    common = {"op": op, "steps": 100}
    _run(api, writer=vision, agent=make_token("agent", node="node-h"), job_id="rn-h100", team="vision",
         node="node-h", gpu_name="NVIDIA H100 80GB HBM3", batch=32, wall_s=0.4, power_w=600.0, mem_gib=40.0,
         t0=t0, **common)
    _run(api, writer=vision, agent=make_token("agent", node="node-l"), job_id="rn-l40s", team="vision",
         node="node-l", gpu_name="NVIDIA L40S", batch=64, wall_s=1.2, power_w=300.0, mem_gib=30.0, t0=t0, **common)
    _run(api, writer=nlp, agent=make_token("agent", node="node-n"), job_id="bert-1", team="nlp", node="node-n",
         gpu_name="NVIDIA H100 80GB HBM3", batch=16, wall_s=0.3, power_w=500.0, mem_gib=20.0, t0=t0, **common)
    return {"op": op, "vision": vision, "nlp": nlp, "sched": make_token("scheduler")}


def test_compare_matches_each_jobs_report(api, runs):
    r = api.get(JOBS + "/compare", params={"ids": "rn-h100,rn-l40s"}, headers=auth(runs["vision"]))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["baseline_job_id"] == "rn-h100" and [j["job_id"] for j in body["jobs"]] == ["rn-h100", "rn-l40s"]
    reports = {j: api.get(f"{JOBS}/{j}/report", headers=auth(runs["vision"])).json() for j in ("rn-h100", "rn-l40s")}
    for row in body["jobs"]:
        rep = reports[row["job_id"]]
        assert row["team"] == "vision" and row["framework"] == "pytorch" and row["state"] == "finished"
        assert row["gpu_name"] == rep["gpus"][0]["name"] and row["gpu_count"] == 1
        assert row["duration_s"] == pytest.approx(rep["duration_s"])
        assert row["peak_used_bytes"] == rep["memory"]["peak_used_bytes"]
        assert row["peak_allocated_bytes"] == rep["memory"]["peak_allocated_bytes"]
        assert row["peak_reserved_bytes"] == rep["memory"]["peak_reserved_bytes"]
        assert row["gpu_util_mean_pct"] == pytest.approx(rep["utilization"]["gpu_mean_pct"])
        assert row["step_time_p50_s"] == pytest.approx(rep["time"]["step_time_s"]["p50"])
        assert row["step_time_p95_s"] == pytest.approx(rep["time"]["step_time_s"]["p95"])
        assert row["samples_per_s"] == pytest.approx(rep["time"]["samples_per_s"])
        assert row["energy_j"] == pytest.approx(rep["energy"]["energy_j"])
        assert row["energy_source"] == rep["energy"]["source"] == "integrated_power"
        assert row["energy_per_step_j"] == pytest.approx(rep["energy"]["energy_per_step_j"])
        assert row["energy_per_sample_j"] == pytest.approx(rep["energy"]["per_sample_j"])
        assert row["mean_power_w"] == pytest.approx(rep["energy"]["mean_power_w"])
    h, l40 = body["jobs"]
    # The figures themselves, independently: 100 steps of batch 32 / 64, memory and power as sent.
    assert h["peak_used_bytes"] == 40 * GIB and l40["peak_used_bytes"] == 30 * GIB
    assert h["energy_per_sample_j"] == pytest.approx(h["energy_j"] / (100 * 32))
    assert l40["mean_power_w"] == pytest.approx(301.0, rel=0.01)
    ratios = l40["vs_baseline"]
    assert ratios["step_time_ratio"] == pytest.approx(l40["step_time_p50_s"] / h["step_time_p50_s"])
    assert ratios["step_time_ratio"] == pytest.approx(3.0, rel=0.02)
    assert ratios["energy_per_sample_ratio"] == pytest.approx(l40["energy_per_sample_j"] / h["energy_per_sample_j"])
    assert ratios["peak_used_ratio"] == pytest.approx(0.75)
    assert set(l40["differs_from_baseline"]) == {"gpu_name", "batch_size"}
    assert body["findings"][0].startswith("rn-l40s is 3.00x slower per step than rn-h100 at ")
    assert body["best"]["fastest_per_step"] == "rn-h100"


def test_compare_visibility_follows_the_single_job_rule(api, runs):
    vision, sched = auth(runs["vision"]), auth(runs["sched"])
    # Another team's job reads exactly like a missing one, and no figure of either is returned.
    r = api.get(JOBS + "/compare", params={"ids": "rn-h100,bert-1"}, headers=vision)
    assert r.status_code == 404 and r.json()["detail"] == api.get(JOBS + "/bert-1", headers=vision).json()["detail"]
    assert "bert-1" in r.json()["detail"] and "rn-h100" not in r.json()["detail"]
    r = api.get(JOBS + "/compare", params={"ids": "rn-h100,nope-1,bert-1"}, headers=vision)
    assert r.status_code == 404 and "'nope-1'" in r.json()["detail"] and "'bert-1'" in r.json()["detail"]
    r = api.get(JOBS + "/compare", params={"ids": "bert-1,rn-h100,rn-l40s"}, headers=sched)
    assert r.status_code == 200 and r.json()["baseline_job_id"] == "bert-1"
    assert api.get(JOBS + "/compare", params={"ids": "rn-h100,rn-l40s"}, headers=auth(runs["op"])).status_code == 200
    assert api.get(JOBS + "/compare", params={"ids": "rn-h100,rn-l40s"}).status_code == 401


@pytest.mark.parametrize("ids, says", [
    ("", "empty"), ("rn-h100", "2 to 20"), ("rn-h100,", "empty"), ("rn-h100,,rn-l40s", "empty"),
    ("rn-h100,rn-l40s,rn-h100", "more than once"), (",".join(f"j{i}" for i in range(21)), "not 21"),
])
def test_bad_ids_are_422_with_a_reason(api, runs, ids, says):
    r = api.get(JOBS + "/compare", params={"ids": ids}, headers=auth(runs["sched"]))
    assert r.status_code == 422 and says in r.json()["detail"], r.text


def test_compare_is_not_taken_for_a_job_id(api, runs):
    r = api.get(JOBS + "/compare", headers=auth(runs["sched"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "ids"]
