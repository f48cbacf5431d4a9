"""The API views the dashboard draws from (server/fleet/dashboard_router.py, /timeseries): downsampled to the plot's
width with extremes kept, step-time histograms counted in SQL, and fleet energy by where it came from."""

from __future__ import annotations

import time

import pytest

from tests.server.helpers import auth, gz, sample_batch

GIB = 2**30


def _ingest(api, token: str, path: str, payload: object) -> None:  # type: ignore[no-untyped-def]
    r = api.post(path, content=gz(payload), headers={**auth(token), "Content-Encoding": "gzip",
                                                     "Content-Type": "application/json"})
    assert r.status_code < 300, r.text


@pytest.fixture
def job_with_steps(api, make_token):  # type: ignore[no-untyped-def]
    """Job "j" of team t: 2 GPUs x 600 s of samples, 2 ranks x 250 steps (step 42 slow on rank 1)."""
    team = make_token("team", team="t")
    t0 = time.time() - 3600
    batch = sample_batch(node="n", n=600, gpus=2, t0=t0)
    batch["samples"]["energy_counter_j"] = [1e5 + 100.0 * (k // 2) for k in range(len(batch["samples"]["ts"]))]
    _ingest(api, make_token("agent", node="n"), "/api/v1/ingest/samples", batch)
    # registered by an operator: a team token may attach only GPUs the agent attributed to it (issue 15)
    r = api.post("/api/v1/jobs", headers=auth(make_token("operator")), json={
        "job_id": "j", "team": "t", "node": "n", "gpu_uuids": ["GPU-n-0", "GPU-n-1"], "state": "finished",
        "started_at": t0, "ended_at": t0 + 599})
    assert r.status_code == 200, r.text
    events = [{"kind": "step", "job_id": "j", "rank": rank, "step": s, "ts": t0 + 5.0 * (s + 1),
               "wall_s": 5.0 if (rank, s) != (1, 42) else 50.0, "allocated_peak_bytes": (s + rank) * GIB,
               "reserved_peak_bytes": 300 * GIB} for rank in (0, 1) for s in range(250)]
    _ingest(api, team, "/api/v1/ingest/events",
            {"protocol_version": 1, "source_id": "hooks", "seq": 0, "sent_at": time.time(), "events": events})
    return {"team": team, "t0": t0}


def test_steps_downsampled_per_rank_keep_their_peaks(api, job_with_steps) -> None:  # type: ignore[no-untyped-def]
    h = auth(job_with_steps["team"])
    full = api.get("/api/v1/jobs/j/steps", headers=h).json()
    assert full["count"] == 500 and "downsampled" not in full  # without points: the steps themselves
    down = api.get("/api/v1/jobs/j/steps", params={"points": 20}, headers=h).json()
    assert down["downsampled"] is True and down["raw_count"] == 500
    assert 0 < down["count"] <= 2 * 20
    for rank in (0, 1):
        mine = [a for r, a in zip(down["rank"], down["allocated_peak_bytes"]) if r == rank]
        assert max(mine) == (249 + rank) * GIB and min(mine) == rank * GIB  # extremes survive exactly
    assert down["ts"] == sorted(down["ts"][:len(down["ts"]) // 2]) + sorted(down["ts"][len(down["ts"]) // 2:])
    few = api.get("/api/v1/jobs/j/steps", params={"points": 1000}, headers=h).json()
    assert few["downsampled"] is False and few["count"] == 500  # under the budget: every step


def test_step_histogram_counts_each_step_once_at_its_slowest_rank(api, job_with_steps) -> None:  # type: ignore[no-untyped-def]
    hist = api.get("/api/v1/jobs/j/steps", params={"points": 20}, headers=auth(job_with_steps["team"])).json()[
        "wall_s_histogram"]
    assert hist["count"] == 250  # steps, not (rank, step) rows
    assert sum(hist["counts"]) + hist["above"] == 250
    assert hist["above"] == 1 and hist["max_s"] == 50.0  # the one slow step, beyond the 99.5th percentile
    assert len(hist["edges_s"]) == len(hist["counts"]) + 1 and hist["edges_s"][0] == 5.0
    zoomed = api.get("/api/v1/jobs/j/steps", headers=auth(job_with_steps["team"]), params={
        "points": 20, "since": job_with_steps["t0"], "until": job_with_steps["t0"] + 5.0 * 10 + 0.5}).json()
    assert zoomed["wall_s_histogram"]["count"] == 10 and zoomed["wall_s_histogram"]["above"] == 0


def test_timeseries_carries_gpu_index_and_capacity_and_keeps_extremes(api, job_with_steps) -> None:  # type: ignore[no-untyped-def]
    h = auth(job_with_steps["team"])
    raw = api.get("/api/v1/jobs/j/timeseries", params={"metric": "memory_used_bytes", "points": 1000},
                  headers=h).json()
    down = api.get("/api/v1/jobs/j/timeseries", params={"metric": "memory_used_bytes", "points": 50},
                   headers=h).json()
    for r, d in zip(raw["series"], down["series"]):
        assert d["gpu_index"] == r["gpu_index"] and d["memory_total_bytes"] == 81559 * 2**20
        assert len(r["values"]) == r["raw_points"] == 600 and len(d["values"]) <= 50
        assert (min(d["values"]), max(d["values"])) == (min(r["values"]), max(r["values"]))
        assert d["ts"] == sorted(d["ts"]) and d["ts"][0] == r["ts"][0] and d["ts"][-1] == r["ts"][-1]


def test_fleet_timeline_says_where_each_hours_energy_came_from(api, make_token, db_session) -> None:  # type: ignore[no-untyped-def]
    from server.fleet.service import rollup_hours

    now = time.time()
    t0 = now - now % 3600 - 2 * 3600 + 60  # inside the hour before last
    counter = sample_batch(node="new", agent_id="a-new", n=120, gpus=1, t0=t0)
    counter["samples"]["energy_counter_j"] = [1e5 + 300.0 * k for k in range(120)]
    _ingest(api, make_token("agent", node="new"), "/api/v1/ingest/samples", counter)
    _ingest(api, make_token("agent", node="old"), "/api/v1/ingest/samples",
            sample_batch(node="old", agent_id="a-old", n=120, gpus=1, t0=t0 + 3600))  # no counter, an hour later
    rollup_hours(db_session, since=t0, until=t0 + 3600 + 120)
    db_session.commit()
    t = api.get("/api/v1/fleet/timeline", headers=auth(make_token("operator"))).json()
    first, second = t["hours"].index(t0 - t0 % 3600), t["hours"].index(t0 - t0 % 3600 + 3600)
    assert t["energy_source"][first] == "hardware_counter" and t["energy_source"][second] == "integrated_power"
    by = t["energy_by_source_j"]
    assert by["hardware_counter"][first] == pytest.approx(300.0 * 119) and by["hardware_counter"][second] is None
    assert by["integrated_power"][second] == pytest.approx(t["energy_j"][second])
    assert "energy_source" in t["sources"]["energy_j"]


def test_timeseries_batch_reads_once_and_answers_as_the_single_calls(api, job_with_steps) -> None:  # type: ignore[no-untyped-def]
    h = auth(job_with_steps["team"])
    batch = api.get("/api/v1/jobs/j/timeseries/batch", headers=h, params=[
        ("metric", "memory_used_bytes"), ("metric", "power_w"), ("points", 100), ("points", 50)])
    assert batch.status_code == 200, batch.text
    metrics = batch.json()["metrics"]
    assert list(metrics) == ["memory_used_bytes", "power_w"] and metrics["power_w"]["unit"] == "W"
    single = api.get("/api/v1/jobs/j/timeseries", params={"metric": "memory_used_bytes", "points": 100},
                     headers=h).json()
    assert metrics["memory_used_bytes"]["series"] == single["series"]  # the finest budget: the same buckets
    for s in metrics["power_w"]["series"]:  # a coarser budget merges whole buckets: extremes kept
        assert len(s["values"]) <= 50 * 1.1 and s["raw_points"] == 600
        raw = [100.0 + k for k in range(600)]
        assert (s["min"], s["max"]) == (min(raw), max(raw))
    for bad in ([("metric", "nope")], [("metric", "power_w"), ("metric", "power_w")],
                [("metric", "power_w"), ("metric", "gpu_util_pct"), ("points", 10), ("points", 20), ("points", 30)]):
        assert api.get("/api/v1/jobs/j/timeseries/batch", params=bad, headers=h).status_code == 422
