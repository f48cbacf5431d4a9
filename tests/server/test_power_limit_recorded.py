"""The power limit the samples carry reaches the report and right-sizing: runs of one job name at two caps give a
power-cap recommendation instead of "needs measuring"."""

from __future__ import annotations

import time

from fleetprof.protocol import PROTOCOL_VERSION
from tests.server.helpers import auth, sample_batch

N = 120  # samples (1 s apart) per run


def _run(api, op, agent, *, job_id: str, seq: int, t0: float, limit_w: float, power_w: float, wall_s: float,
         limits: list[float] | None = None) -> None:  # type: ignore[no-untyped-def]
    api.post("/api/v1/jobs", json={"job_id": job_id, "name": "resnet-cap", "team": "vision", "node": "node-a",
                                   "gpu_uuids": ["GPU-node-a-0"], "started_at": t0, "state": "running"},
             headers=auth(op))
    batch = sample_batch(seq=seq, n=N, gpus=1, t0=t0)
    s = batch["samples"]
    s["power_w"] = [power_w] * N
    s["energy_counter_j"] = [1000.0 + power_w * k for k in range(N)]
    s["power_limit_w"] = limits or [limit_w] * N
    s["app_sm_clock_mhz"] = [1755.0] * N
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    steps = int((N - 1) / wall_s)
    events = [{"kind": "step", "job_id": job_id, "ts": t0 + (k + 1) * wall_s, "step": k, "wall_s": wall_s,
               "samples": 32} for k in range(steps)]
    r = api.post("/api/v1/ingest/events", json={"protocol_version": PROTOCOL_VERSION, "source_id": f"h-{job_id}",
                                                "seq": 0, "sent_at": time.time(), "events": events}, headers=auth(op))
    assert r.status_code == 200, r.text
    api.post("/api/v1/jobs", json={"job_id": job_id, "state": "finished", "ended_at": t0 + N - 1, "exit_code": 0},
             headers=auth(op))


def test_power_limit_in_report_and_power_cap_recommended(api, make_token):  # type: ignore[no-untyped-def]
    op, agent = make_token("operator"), make_token("agent", node="node-a")
    t0 = time.time() - 86400
    # At 700 W: 600 W drawn, 1.0 s per step. At 450 W: 420 W drawn, 1.05 s per step (5% slower, less energy).
    _run(api, op, agent, job_id="cap-700", seq=0, t0=t0, limit_w=700.0, power_w=600.0, wall_s=1.0)
    _run(api, op, agent, job_id="cap-450", seq=1, t0=t0 + 3600, limit_w=450.0, power_w=420.0, wall_s=1.05,
         limits=[700.0] * 10 + [450.0] * (N - 10))  # capped 10 s into the run: the limit in force most of it
    report = api.get("/api/v1/jobs/cap-450/report", headers=auth(op)).json()
    gpu = report["gpus"][0]
    assert gpu["power_limit_w"] == 450.0 and gpu["power_limit_changed"] is True
    assert gpu["app_sm_clock_mhz"] == 1755.0
    assert report["rightsizing_inputs"]["power_limit_w"] == 450.0
    first = api.get("/api/v1/jobs/cap-700/report", headers=auth(op)).json()
    assert first["gpus"][0]["power_limit_changed"] is False and first["rightsizing_inputs"]["power_limit_w"] == 700.0

    body = api.get("/api/v1/rightsizing", params={"name": "resnet-cap"}, headers=auth(op)).json()
    cap = next(r for r in body["recommendations"] if r["kind"] == "power_cap")
    assert cap["summary"] == "Cap power at 450 W", cap
    assert cap["evidence"]["caps_measured"] == [450.0, 700.0]
    assert 0 < cap["saving"]["energy_fraction"] < 1
