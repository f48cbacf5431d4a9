"""A job whose GPU ran within 5 % of capacity gets fit advice in its report, from the trace it uploaded."""

from __future__ import annotations

import time
from pathlib import Path

from tests.server.helpers import auth, sample_batch

TRACE = Path(__file__).resolve().parents[1] / "data/kineto/tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
MiB = 1 << 20


def test_near_capacity_job_gets_amp_and_batch_advice(api, make_token):
    agent, team = make_token("agent", node="node-f"), make_token("team", team="nlp")
    t0 = time.time() - 600
    r = api.post("/api/v1/jobs", json={"job_id": "fit-1", "team": "nlp", "node": "node-f", "batch_size": 32,
                                       "gpu_uuids": ["GPU-node-f-0"], "started_at": t0, "state": "running"},
                 headers=auth(agent))
    assert r.status_code == 200, r.text
    batch = sample_batch(node="node-f", agent_id="agent-f", n=20, gpus=1, t0=t0)
    capacity = batch["gpus"][0]["memory_total_bytes"]
    batch["samples"]["memory_used_bytes"] = [int(0.97 * capacity)] * 20  # within 5 % of capacity
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    r = api.post("/api/v1/jobs/fit-1/traces", content=TRACE.read_bytes(), params={"filename": TRACE.name},
                 headers={**auth(team), "Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text
    report = api.get("/api/v1/jobs/fit-1/report", params={"refresh": "true"}, headers=auth(team)).json()
    recs = {r["kind"]: r for r in report["recommendations"]}
    step = report["optimization"]["memory_breakdown"]["step_allocations"]["bytes"]
    assert step > 0
    # no layer table: no checkpointing advice; AMP from the trace's step allocations (no weights known): half
    assert "activation_checkpointing" not in recs
    assert recs["amp_bf16"]["saving"]["bytes"] == step // 2
    # the step's few MiB are nothing beside 97 % of the GPU: the part that does not scale already fills it
    fit = recs["batch_size_fit"]["evidence"]
    assert fit["batch_size"] == 32 and fit["largest_batch"] is None
    assert fit["fixed_bytes"] == fit["peak_bytes"] - step > 0.95 * capacity
    assert recs["batch_size_fit"]["summary"].startswith("No batch size leaves 5 % free")
    assert "allocator_settings" in recs  # the trace's own allocator comparison rides along
