"""A power-cap sweep (agent/tune.py) on the NVML test double, each run recorded as a job of one name whose samples
carry the limit the device layer reads back, gives a power-cap recommendation with energy and time per step at
both caps, and `fleetprof tune`'s table shows them. The draw and step time at each cap are the test double's
model (labelled: no GPU here): 600 W drawn / 1.0 s per step at 700 W, 420 W / 1.05 s at 450 W."""

from __future__ import annotations

import time

import httpx

from agent.cli.tune import fetch_recommendation, sweep_text
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from agent.tune import CapRun, run_sweep
from fleetprof.client import Client
from fleetprof.protocol import PROTOCOL_VERSION
from tests.server.helpers import auth, sample_batch

N = 120
MODEL = {700.0: (600.0, 1.0), 450.0: (420.0, 1.05)}  # cap W -> (drawn W, s per step): the double's model


def test_two_cap_sweep_gives_a_power_cap_recommendation(api, make_token):  # type: ignore[no-untyped-def]
    op, agent = make_token("operator"), make_token("agent", node="node-t")
    fake = FakeNvml([FakeGpu(uuid="GPU-node-t-0")])
    devices = NvmlDevices(fake, xid_events=False)
    t0 = time.time() - 86400

    def run_one(cap_w: float) -> CapRun:
        k = len(MODEL) - sum(1 for c in MODEL if c <= cap_w)  # 0 for the first run, 1 for the second
        job_id, start = f"tune-{cap_w:g}", t0 + 3600 * k
        enforced_w = (devices.read(0).power_limit_mw or 0) / 1000  # what the sampler records
        power_w, wall_s = MODEL[enforced_w]
        api.post("/api/v1/jobs", json={"job_id": job_id, "name": "tiny-cap", "team": "vision", "node": "node-t",
                                       "gpu_uuids": ["GPU-node-t-0"], "started_at": start, "state": "running"},
                 headers=auth(op))
        batch = sample_batch(seq=k, n=N, gpus=1, t0=start, node="node-t")
        s = batch["samples"]
        s["power_w"] = [power_w] * N
        s["energy_counter_j"] = [1000.0 + power_w * i for i in range(N)]
        s["power_limit_w"] = [enforced_w] * N
        assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
        events = [{"kind": "step", "job_id": job_id, "ts": start + (i + 1) * wall_s, "step": i, "wall_s": wall_s,
                   "samples": 32} for i in range(int((N - 1) / wall_s))]
        r = api.post("/api/v1/ingest/events", json={"protocol_version": PROTOCOL_VERSION, "source_id": f"h-{job_id}",
                                                    "seq": 0, "sent_at": time.time(), "events": events},
                     headers=auth(op))
        assert r.status_code == 200, r.text
        api.post("/api/v1/jobs", json={"job_id": job_id, "state": "finished", "ended_at": start + N - 1,
                                       "exit_code": 0}, headers=auth(op))
        return CapRun(cap_w, job_id, "finished", 0)

    runs = run_sweep(devices, [700.0, 450.0], run_one)
    assert fake.gpus[0].power_limit_mw == 700_000  # restored
    # what `fleetprof tune` asks, through the client (the TestClient is its httpx client)
    def forward(request: httpx.Request) -> httpx.Response:
        r = api.request(request.method, request.url.raw_path.decode(), headers=dict(request.headers),
                        content=request.content)
        return httpx.Response(r.status_code, headers={"content-type": r.headers.get("content-type", "")},
                              content=r.content)

    client = Client("http://testserver", op, transport=httpx.MockTransport(forward))
    body = fetch_recommendation(client, runs, "tiny-cap", None)
    cap = next(r for r in body["recommendations"] if r["kind"] == "power_cap")
    assert cap["summary"] == "Cap power at 450 W", cap
    ev = cap["evidence"]
    assert ev["caps_measured"] == [450.0, 700.0]
    assert [p["power_limit_w"] for p in ev["per_cap"]] == [700.0, 450.0]
    by_job = {m["job_id"]: m for m in ev["runs"]}
    assert set(by_job) == {"tune-700", "tune-450"}
    assert by_job["tune-700"]["step_time_s"] == 1.0 and abs(by_job["tune-450"]["step_time_s"] - 1.05) < 1e-9
    assert by_job["tune-450"]["energy_per_step_j"] < by_job["tune-700"]["energy_per_step_j"]
    text = sweep_text(runs, body)
    assert "recommendation: Cap power at 450 W" in text
    row = next(line for line in text.splitlines() if line.endswith("tune-450")).split()
    assert row[:2] == ["450", "450"] and float(row[2]) == 1.05 and float(row[3]) > 0
