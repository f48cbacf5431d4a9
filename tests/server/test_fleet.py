"""Fleet rollups and summary through the API, checked against an independent computation."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from server.db import make_engine, make_sessionmaker, session_scope
from server.fleet.service import rollup_hours
from tests.server.helpers import auth, sample_batch


def test_fleet_summary_matches_an_independent_computation(api, make_token, server_settings):
    op = make_token("operator")
    now = time.time()
    t0 = now - 3 * 3600
    t0 -= t0 % 3600  # three whole hours of 1 Hz samples, then one recent minute
    sent: dict[str, list[tuple[float, float, float]]] = {}
    for node, util_of in (("node-a", lambda k: 0.0 if k % 4 == 0 else 80.0), ("node-b", lambda k: 3.0)):
        agent = make_token("agent", node=node)
        for seq in range(11):
            batch = sample_batch(node=node, agent_id=f"a-{node}", seq=seq, n=1000, gpus=2, t0=t0 + 1000 * seq)
            s = batch["samples"]
            s["gpu_util_pct"] = [util_of(int(ts - t0)) for ts in s["ts"]]
            s["power_w"] = [200.0] * len(s["ts"])
            for ts, u, util, p in zip(s["ts"], s["gpu_uuid"], s["gpu_util_pct"], s["power_w"]):
                sent.setdefault(f"{node}/{u}", []).append((ts, util, p))
            # the most recent minute, so that "idle now" is known
            assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
        recent = sample_batch(node=node, agent_id=f"a-{node}", seq=99, n=60, gpus=2, t0=now - 60)
        recent["samples"]["gpu_util_pct"] = [util_of(1)] * len(recent["samples"]["ts"])
        assert api.post("/api/v1/ingest/samples", json=recent, headers=auth(agent)).status_code == 200
    engine = make_engine(server_settings)
    with session_scope(make_sessionmaker(engine)) as session:
        assert rollup_hours(session, since=t0, until=now) > 0
    engine.dispose()

    body = api.get("/api/v1/fleet/summary", params={"window": "6h"}, headers=auth(op)).json()
    # Independent: 1 Hz samples each stand for 1 s; busy = util >= 5 %; energy = power x time.
    covered = sum(len(v) for v in sent.values()) + 4 * 60
    busy = sum(1 for v in sent.values() for _, util, _ in v if util >= 5) + 2 * 60
    assert body["gpus_total"] == 4
    assert body["gpu_hours"] == pytest.approx(covered / 3600, rel=0.01)
    assert body["busy_gpu_hours"] == pytest.approx(busy / 3600, rel=0.01)
    assert body["idle_gpus_now"] == 2  # node-b's GPUs at 3 %
    assert body["gpus_unknown_now"] == 0
    assert body["energy_j"] == pytest.approx(sum(p for v in sent.values() for *_, p in v), rel=0.02)
    # MIG-like GPUs (NVML has no utilization) are "unknown now", neither idle nor busy; a sample stamped an hour
    # ahead (a skewed clock) is not "now".
    mig = sample_batch(node="node-c", agent_id="a-node-c", seq=0, n=30, gpus=2, t0=now - 30)
    mig["samples"]["gpu_util_pct"] = [None] * len(mig["samples"]["ts"])
    ahead = sample_batch(node="node-c", agent_id="a-node-c", seq=1, n=1, gpus=2, t0=now + 3600)
    ahead["samples"]["gpu_util_pct"] = [1.0] * len(ahead["samples"]["ts"])
    for batch in (mig, ahead):
        assert api.post("/api/v1/ingest/samples", json=batch,
                        headers=auth(make_token("agent", node="node-c"))).status_code == 200
    body = api.get("/api/v1/fleet/summary", params={"window": "6h"}, headers=auth(op)).json()
    assert (body["idle_gpus_now"], body["gpus_unknown_now"]) == (2, 2)
    assert api.get("/api/v1/fleet/summary", params={"window": "soon"}, headers=auth(op)).status_code == 422
    assert api.get("/api/v1/fleet/summary", headers=auth(make_token("scheduler"))).status_code == 403


# ------------------------------------------------------------------ hourly rollups per GPU, node and team

HELIOS = "cluster/helios/analysis/2_cluster characterization/Earth_vcs/vc3sl/cluster_sequence_vc.csv"
NODES, PER_NODE, MINUTES = 8, 8, 180
GIB, MIB = 2**30, 2**20


def _helios_fleet(real_data, t0: float) -> pd.DataFrame:
    """Helios vc3sl, 2020-05-01 09:00-12:00 (running GPUs fall from 54 to 38 and climb to 64), re-timed to start
    at t0: one row per minute and GPU of its 64 GPUs as 8 nodes x 8; GPU g is busy at minute k when
    g < running_gpu_num[k] (the trace counts GPUs; any assignment gives the same totals). Utilization, power and
    memory are derived from busy/idle."""
    seq = pd.read_csv(real_data / HELIOS, nrows=1440)
    seq = seq[(seq["time"] >= "2020-05-01 09:00:00") & (seq["time"] < "2020-05-01 12:00:00")]
    running = seq["running_gpu_num"].to_numpy()
    assert len(running) == MINUTES and running.min() < running.max()
    g, k = np.meshgrid(np.arange(NODES * PER_NODE), np.arange(MINUTES), indexing="ij")
    g, k = g.ravel(), k.ravel()
    busy = g < running[k]
    util = np.where(busy, 50.0 + (g * 7 + k) % 50, 0.0)
    return pd.DataFrame({
        "node": [f"node-{x // PER_NODE}" for x in g], "gpu": [f"GPU-node-{x // PER_NODE}-{x % PER_NODE}" for x in g],
        "ts": t0 + 60.0 * k, "util": util, "power": 60.0 + 3.0 * util,
        "mem": np.where(busy, (20 + g % 8) * GIB + k * MIB, 512 * MIB).astype(np.int64)})


def _post_fleet(api, make_token, df: pd.DataFrame) -> None:  # type: ignore[no-untyped-def]
    for node, part in df.groupby("node"):
        part = part.sort_values(["ts", "gpu"])
        batch = sample_batch(node=node, agent_id=f"agent-{node}", seq=1, n=1, gpus=PER_NODE)
        batch["samples"] = {"ts": part["ts"].tolist(), "gpu_uuid": part["gpu"].tolist(),
                            "gpu_util_pct": part["util"].tolist(), "power_w": part["power"].tolist(),
                            "memory_used_bytes": part["mem"].tolist()}
        r = api.post("/api/v1/ingest/samples", json=batch, headers=auth(make_token("agent", node=node)))
        assert r.status_code == 200 and r.json()["accepted"] == len(part), r.text


def _expected(df: pd.DataFrame, jobs: list[dict], now: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Independent figures: per sample its 60 s, busy at >= 5 %, the energy of the interval it starts
    (trapezoid to the next sample of its GPU), then each sample split evenly among the jobs whose registered
    window [start, end or now] holds it (its team, or None; None also when no job holds it)."""
    df = df.sort_values(["gpu", "ts"]).copy()
    df["hour"] = np.floor(df["ts"] / 3600) * 3600
    df["dur"] = 60.0
    df["busy_s"] = np.where(df["util"] >= 5, 60.0, 0.0)
    df["energy"] = 0.5 * (df["power"] + df.groupby("gpu")["power"].shift(-1)) * 60.0
    parts = []
    for job in jobs:
        sel = df["gpu"].isin(job["gpus"]) & (df["ts"] >= job["start"]) & (df["ts"] <= job.get("end", now))
        parts.append(df[sel].assign(job=job["job_id"], team=job["team"]))
    held = pd.concat(parts)
    share = 1.0 / held.groupby(["gpu", "ts"])["job"].transform("count")
    held = held.assign(w=share)
    free = df.merge(held[["gpu", "ts"]].drop_duplicates(), how="left", indicator=True)
    free = free[free["_merge"] == "left_only"].drop(columns="_merge").assign(job=None, team=None, w=1.0)
    shares = pd.concat([held, free], ignore_index=True)
    shares["team"] = shares["team"].astype(object).where(shares["team"].notna(), "(none)")
    return df, shares


def test_rollups_per_node_and_team_match_an_independent_computation(api, make_token, server_settings, real_data):
    op = make_token("operator")
    now = time.time()
    t0 = now - now % 3600 - 4 * 3600
    df = _helios_fleet(real_data, t0)
    _post_fleet(api, make_token, df)

    def node_gpus(n: int, idx: range) -> list[str]:
        return [f"GPU-node-{n}-{i}" for i in idx]

    jobs = [  # windows on exact sample instants (both ends count) and between them; two teams share GPUs 2-3
        {"job_id": "v-train", "team": "vision", "node": "node-0", "gpus": node_gpus(0, range(8)),
         "start": t0 + 600, "end": t0 + 6000},
        {"job_id": "v-eval", "team": "vision", "node": "node-1", "gpus": node_gpus(1, range(4)), "start": t0 + 3630},
        {"job_id": "n-pre", "team": "nlp", "node": "node-1", "gpus": node_gpus(1, range(2, 6)),
         "start": t0 + 1800, "end": t0 + 9000},
        {"job_id": "x-1", "team": None, "node": "node-2", "gpus": node_gpus(2, [0]), "start": t0, "end": t0 + 3000},
    ]
    for job in jobs:
        body = {"job_id": job["job_id"], "team": job["team"], "node": job["node"], "gpu_uuids": job["gpus"],
                "started_at": job["start"], "state": "finished" if "end" in job else "running"}
        if "end" in job:
            body["ended_at"] = job["end"]
        assert api.post("/api/v1/jobs", json=body, headers=auth(op)).status_code == 200
    engine = make_engine(server_settings)
    with session_scope(make_sessionmaker(engine)) as session:
        assert rollup_hours(session, since=t0, until=now, now=now) == NODES * PER_NODE * 3
    engine.dispose()
    df, shares = _expected(df, jobs, now)

    # ---- per node: plain sums over the node's samples
    body = api.get("/api/v1/fleet/rollups", params={"by": "node", "window": "6h"}, headers=auth(op)).json()
    assert body["by"] == "node" and body["total"] == NODES * 3 == len(body["rows"])
    ref = df.groupby(["hour", "node"]).agg(gpus=("gpu", "nunique"), dur=("dur", "sum"), busy=("busy_s", "sum"),
                                           util=("util", "mean"), energy=("energy", "sum"), mem=("mem", "max"))
    for row in body["rows"]:
        want = ref.loc[(row["hour_start"], row["node"])]
        assert row["key"] == row["node"] and row["gpus"] == want["gpus"] == PER_NODE
        assert row["gpu_hours"] == pytest.approx(want["dur"] / 3600)
        assert row["busy_gpu_hours"] == pytest.approx(want["busy"] / 3600)
        assert row["busy_fraction"] == pytest.approx(want["busy"] / want["dur"])
        assert row["util_mean_pct"] == pytest.approx(want["util"])
        assert row["energy_j"] == pytest.approx(want["energy"])
        assert row["memory_used_max_bytes"] == want["mem"]
        assert row["energy_source_gpu_hours"]["integrated_power"] == pytest.approx(want["dur"] / 3600)
        assert row["energy_source_gpu_hours"]["hardware_counter"] == 0
    busiest = max(body["rows"], key=lambda r: r["busy_gpu_hours"])
    assert busiest["node"] == "node-0" and min(r["busy_fraction"] for r in body["rows"]) < 0.5

    # ---- per team: each sample's shares
    body = api.get("/api/v1/fleet/rollups", params={"by": "team", "window": "6h"}, headers=auth(op)).json()
    got = {(r["hour_start"], r["team"] or "(none)"): r for r in body["rows"]}
    sw = shares.assign(wdur=shares["w"] * shares["dur"], wbusy=shares["w"] * shares["busy_s"],
                       wutil=shares["w"] * shares["util"], wenergy=shares["w"] * shares["energy"])
    ref = sw.groupby(["hour", "team"]).agg(gpus=("gpu", "nunique"), jobs=("job", "nunique"), w=("w", "sum"),
                                           dur=("wdur", "sum"), busy=("wbusy", "sum"), util=("wutil", "sum"),
                                           energy=("wenergy", "sum"), mem=("mem", "max"))
    assert set(got) == set(ref.index) and {t for _, t in got} == {"vision", "nlp", "(none)"}
    for key, want in ref.iterrows():
        row = got[key]
        assert row["gpus"] == want["gpus"] and row["jobs"] == want["jobs"], key
        assert row["gpu_hours"] == pytest.approx(want["dur"] / 3600), key
        assert row["busy_gpu_hours"] == pytest.approx(want["busy"] / 3600), key
        assert row["util_mean_pct"] == pytest.approx(want["util"] / want["w"]), key
        assert row["energy_j"] == pytest.approx(want["energy"]), key
        assert row["memory_used_max_bytes"] == want["mem"], key
    # Shares add up: every hour's team GPU-hours are the fleet's GPU-hours, and nlp's include half of GPUs 2-3.
    for hour in ref.index.get_level_values("hour").unique():
        assert sum(r["gpu_hours"] for (h, _), r in got.items() if h == hour) == pytest.approx(
            df[df["hour"] == hour]["dur"].sum() / 3600)
    shared = shares[(shares["team"] == "nlp") & (shares["w"] < 1)]
    assert len(shared) and set(shared["gpu"]) == {"GPU-node-1-2", "GPU-node-1-3"}

    # ---- per GPU, and the window keeps only the hours starting in it
    body = api.get("/api/v1/fleet/rollups", params={"by": "gpu", "window": "3h", "limit": 10},
                   headers=auth(op)).json()
    assert body["total"] == NODES * PER_NODE and len(body["rows"]) == 10
    assert {r["hour_start"] for r in body["rows"]} == {t0 + 2 * 3600}
    row = body["rows"][0]
    one = df[(df["gpu"] == row["gpu_uuid"]) & (df["hour"] == row["hour_start"])]
    assert row["key"] == f"{row['node']}/{row['gpu_uuid']}" and row["gpus"] == 1
    assert row["gpu_hours"] == pytest.approx(len(one) / 60) and row["energy_j"] == pytest.approx(one["energy"].sum())
    assert row["util_mean_pct"] == pytest.approx(one["util"].mean())
    for params in ({"by": "rack"}, {"window": "soon"}, {"limit": 0}):
        assert api.get("/api/v1/fleet/rollups", params=params, headers=auth(op)).status_code == 422
    assert api.get("/api/v1/fleet/rollups", headers=auth(make_token("scheduler"))).status_code == 403


# ------------------------------------------------------------------ job rows of the summary, from the reports


def test_summary_job_figures_come_from_the_reports_small_fleet_rows(api, make_token, server_settings):
    """Memory stranded and the most wasteful jobs equal what each job's report says; the summary reads the
    reports' `fleet_row` (never the documents), and a report stored before that column existed gives the same."""
    from sqlalchemy import text

    op = make_token("operator")
    now = time.time()
    t0 = now - 1800
    peaks = {}
    for node, util in (("node-j", 90.0), ("node-k", 10.0)):
        batch = sample_batch(node=node, agent_id=f"a-{node}", n=600, gpus=2, t0=t0)
        batch["samples"]["gpu_util_pct"] = [util] * len(batch["samples"]["ts"])
        assert api.post("/api/v1/ingest/samples", json=batch,
                        headers=auth(make_token("agent", node=node))).status_code == 200
        job = {"job_id": f"job-{node}", "team": "alpha", "node": node, "state": "finished", "started_at": t0,
               "ended_at": t0 + 599, "gpu_uuids": [f"GPU-{node}-0", f"GPU-{node}-1"]}
        assert api.post("/api/v1/jobs", json=job, headers=auth(op)).status_code == 200
        report = api.get(f"/api/v1/jobs/job-{node}/report", headers=auth(op)).json()
        peaks[f"job-{node}"] = report
    stranded = sum(g["memory_total_bytes"] - g["peak_used_bytes"] for r in peaks.values() for g in r["gpus"])

    def summary() -> dict:
        body = api.get("/api/v1/fleet/summary", params={"window": "2h"}, headers=auth(op)).json()
        # the headroom view reads the same rows: each job's largest single-GPU peak against its capacity
        headroom = api.get("/api/v1/fleet/headroom", params={"window": "2h"}, headers=auth(op)).json()
        body["headroom"] = {j["job_id"]: j for j in headroom["jobs"]}
        return body

    engine = make_engine(server_settings)
    try:
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM reports WHERE fleet_row IS NOT NULL")).scalar()
        assert stored == 2
        body = summary()
        assert body["memory_stranded_bytes"] == stranded
        wasteful = body["most_wasteful_jobs"]
        assert wasteful[0]["job_id"] == "job-node-k"  # 10 % busy wastes more GPU-hours than 90 %
        for row in wasteful:
            assert row["gpu_busy_fraction"] == pytest.approx(peaks[row["job_id"]]["time"]["gpu_busy_fraction"])
        assert set(body["headroom"]) == set(peaks)
        for job_id, row in body["headroom"].items():
            mem = peaks[job_id]["memory"]
            assert (row["peak_used_bytes"], row["memory_total_bytes"], row["headroom_bytes"], row["gpu_count"]) == (
                mem["peak_used_bytes"], mem["memory_total_bytes"], mem["headroom_bytes"], 2)
            assert row["headroom_bytes"] is not None and row["headroom_bytes"] > 0
        with engine.begin() as conn:  # one row lacking a key added later: summed in SQL and derived, mixed
            conn.execute(text("UPDATE reports SET fleet_row = fleet_row - 'headroom_bytes' "
                              "WHERE job_pk = (SELECT min(job_pk) FROM reports)"))
        mixed = summary()
        with engine.begin() as conn:  # as a report written before migration 0007 would be
            conn.execute(text("UPDATE reports SET fleet_row = NULL"))
        again = summary()
        for key in ("memory_stranded_bytes", "most_wasteful_jobs", "headroom"):
            assert mixed[key] == body[key], key
            assert again[key] == body[key], key
    finally:
        engine.dispose()
