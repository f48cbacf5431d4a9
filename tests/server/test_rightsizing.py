"""Right-sizing over the runs of one recurring job, answered from cached reports."""

from __future__ import annotations

import time

from tests.server.helpers import auth, sample_batch


def _run(api, op, agent, job_id: str, seq0: int, t0: float, mem_gib: float, name: str = "bert-finetune"):  # type: ignore[no-untyped-def]
    api.post("/api/v1/jobs", json={"job_id": job_id, "name": name, "team": "nlp", "node": "node-a",
                                   "gpu_uuids": ["GPU-node-a-0"], "started_at": t0, "state": "running",
                                   "batch_size": 32}, headers=auth(op))
    batch = sample_batch(seq=seq0, n=120, gpus=1, t0=t0)
    batch["samples"]["memory_used_bytes"] = [int(mem_gib * 2**30)] * 120
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    api.post("/api/v1/jobs", json={"job_id": job_id, "state": "finished", "ended_at": t0 + 119, "exit_code": 0},
             headers=auth(op))
    api.get(f"/api/v1/jobs/{job_id}/report", headers=auth(op))


def test_recurring_job_history_drives_the_recommendation(api, make_token):
    op, agent = make_token("operator"), make_token("agent", node="node-a")
    sched, other_team = make_token("scheduler"), make_token("team", team="vision")
    t0 = time.time() - 86400
    for i, gib in enumerate((10.0, 12.0, 11.0)):
        _run(api, op, agent, f"bert-{i}", i, t0 + 3600 * i, gib)
    _run(api, op, agent, "other-0", 10, t0 + 20000, 70.0, name="something else")
    r = api.get("/api/v1/jobs/bert-2/rightsizing", headers=auth(sched))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["history_job_ids"] == ["bert-0", "bert-1", "bert-2"] and body["runs"] == 3
    mem = body["memory"]
    assert mem["observed_peak_bytes"] == 12 * 2**30  # the largest peak over the runs, not the other job's 70 GiB
    assert mem["target_bytes"] >= mem["observed_peak_bytes"]
    kinds = {rec["kind"] for rec in body["recommendations"]}
    assert kinds and all(rec["reason"] for rec in body["recommendations"])
    assert api.get("/api/v1/jobs/bert-2/rightsizing", headers=auth(other_team)).status_code == 404
    assert api.get("/api/v1/jobs/nope/rightsizing", headers=auth(sched)).status_code == 404
