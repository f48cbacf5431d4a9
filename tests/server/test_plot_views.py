"""Stored plot views (server.jobs.plot_views): a finished job's whole-range plots come from the views stored with its
final report, exactly as the samples would give them; zoomed views, running jobs and jobs changed since still read
the samples."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import delete, func, select

from tests.server.helpers import auth, gz, sample_batch

GIB = 2**30
BUDGETS = [("metric", "memory_used_bytes"), ("metric", "power_w"), ("metric", "gpu_util_pct"),
           ("points", 100), ("points", 40), ("points", 40)]


def _ingest(api, token: str, path: str, payload: object) -> None:  # type: ignore[no-untyped-def]
    r = api.post(path, content=gz(payload), headers={**auth(token), "Content-Encoding": "gzip",
                                                     "Content-Type": "application/json"})
    assert r.status_code < 300, r.text


@pytest.fixture
def finished_job(api, make_token, db_session):  # type: ignore[no-untyped-def]
    """Job "v": 2 GPUs x 900 s of samples (a gap in power), 2 ranks x 300 steps, ended an hour ago. Registered as
    finished, it is characterized at once (a background task here), and its steps arrive after that."""
    op = make_token("operator")
    t0 = time.time() - 7200
    batch = sample_batch(node="n", n=900, gpus=2, t0=t0)
    power = batch["samples"]["power_w"]
    batch["samples"]["power_w"] = [None if 300 <= k // 2 < 400 else p for k, p in enumerate(power)]
    _ingest(api, make_token("agent", node="n"), "/api/v1/ingest/samples", batch)
    r = api.post("/api/v1/jobs", headers=auth(op), json={
        "job_id": "v", "team": "t", "node": "n", "gpu_uuids": ["GPU-n-0", "GPU-n-1"], "state": "finished",
        "started_at": t0, "ended_at": t0 + 899})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while _stored_count(db_session) == 0:  # the end-of-job characterization, on its background thread
        assert time.monotonic() < deadline, "the finished job was never characterized"
        time.sleep(0.05)
    events = [{"kind": "step", "job_id": "v", "rank": rank, "step": s, "ts": t0 + 3.0 * (s + 1),
               "wall_s": 3.0 + (s % 7) * 0.1 + (20.0 if (rank, s) == (1, 99) else 0.0),
               "allocated_peak_bytes": (s + rank) * GIB if s % 5 else None, "reserved_peak_bytes": 300 * GIB}
              for rank in (0, 1) for s in range(300)]
    _ingest(api, op, "/api/v1/ingest/events",
            {"protocol_version": 1, "source_id": "hooks", "seq": 0, "sent_at": time.time(), "events": events})
    return {"op": op, "t0": t0}


def _views(api, op: str) -> tuple[dict, dict, dict]:  # type: ignore[no-untyped-def]
    h = auth(op)
    batch = api.get("/api/v1/jobs/v/timeseries/batch", params=BUDGETS, headers=h)
    single = api.get("/api/v1/jobs/v/timeseries", params={"metric": "power_w", "points": 60}, headers=h)
    steps = api.get("/api/v1/jobs/v/steps", params={"points": 50}, headers=h)
    for r in (batch, single, steps):
        assert r.status_code == 200, r.text
    return batch.json(), single.json(), steps.json()


def _stored_count(db_session) -> int:  # type: ignore[no-untyped-def]
    from server.models import PlotView

    db_session.expire_all()
    return db_session.scalar(select(func.count()).select_from(PlotView))


def _drop_raw_data(db_session) -> None:  # type: ignore[no-untyped-def]
    from server.models import GpuSample, JobStep

    db_session.execute(delete(GpuSample))
    db_session.execute(delete(JobStep))
    db_session.commit()


def test_final_views_are_stored_and_answer_exactly_as_the_samples(api, finished_job, db_session) -> None:  # type: ignore[no-untyped-def]
    op = finished_job["op"]
    from server.jobs.report_store import final_plot_views
    from server.models import Job

    job = db_session.scalar(select(Job).where(Job.job_id == "v"))
    assert final_plot_views(db_session, job) is None  # stored at the end, stale since the steps came
    from_samples = _views(api, op)  # so these read the samples
    assert api.get("/api/v1/jobs/v/report", params={"refresh": "true"}, headers=auth(op)).status_code == 200
    assert _stored_count(db_session) == 1  # the final report stored the views beside it, replacing the old
    db_session.expire_all()
    views = final_plot_views(db_session, job)
    assert views is not None and views.steps is not None and len(views.gpus) == 2

    assert _views(api, op) == from_samples  # the stored views, bit for bit the same answers
    batch, _, steps = from_samples
    for s in batch["metrics"]["memory_used_bytes"]["series"]:
        assert s["raw_points"] == 900 and len(s["values"]) <= 100
    assert batch["metrics"]["power_w"]["series"][0]["raw_points"] == 800  # the gap is not counted as samples
    assert steps["downsampled"] is True and steps["raw_count"] == 600 and steps["wall_s_histogram"]["above"] == 1
    assert None in steps["allocated_peak_bytes"] or steps["allocated_peak_bytes"]  # nulls pass through as null

    _drop_raw_data(db_session)  # from now on only the stored views can answer the whole range
    assert _views(api, op) == from_samples
    zoomed = api.get("/api/v1/jobs/v/timeseries", headers=auth(op), params={
        "metric": "power_w", "points": 60, "since": finished_job["t0"], "until": finished_job["t0"] + 100}).json()
    assert all(s["raw_points"] == 0 for s in zoomed["series"])  # a zoom reads the samples (gone here)
    every = api.get("/api/v1/jobs/v/timeseries", params={"metric": "power_w", "points": 5000},
                    headers=auth(op)).json()
    assert all(s["raw_points"] == 0 for s in every["series"])  # a budget above the sample count wants the samples


def test_no_views_for_a_running_job_and_none_used_after_the_job_changed(api, finished_job, make_token,  # type: ignore[no-untyped-def]
                                                                        db_session) -> None:
    op = finished_job["op"]
    running = sample_batch(node="r", agent_id="agent-r", n=300, gpus=1, t0=time.time() - 400)
    _ingest(api, make_token("agent", node="r"), "/api/v1/ingest/samples", running)
    assert api.post("/api/v1/jobs", headers=auth(op), json={
        "job_id": "run", "node": "r", "gpu_uuids": ["GPU-r-0"], "state": "running",
        "started_at": time.time() - 400}).status_code == 200
    assert api.get("/api/v1/jobs/run/report", headers=auth(op)).status_code == 200
    from server.models import Job, PlotView

    running_pk = db_session.scalar(select(Job.id).where(Job.job_id == "run"))
    assert db_session.get(PlotView, running_pk) is None  # a running job's plots still change: none stored

    assert api.get("/api/v1/jobs/v/report", params={"refresh": "true"}, headers=auth(op)).status_code == 200
    assert _stored_count(db_session) == 1
    time.sleep(0.01)
    r = api.post("/api/v1/jobs", headers=auth(op), json={"job_id": "v", "name": "renamed"})  # an update after
    assert r.status_code == 200, r.text
    _drop_raw_data(db_session)
    batch, _, _ = _views(api, op)
    assert all(s["raw_points"] == 0 for s in batch["metrics"]["memory_used_bytes"]["series"])  # not the old views


def test_embedded_mode_stores_and_serves_the_same_views(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite (fleetprof up): the same bucket rule through the other dialect."""
    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.auth.service import create_token
    from server.config import ServerSettings
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.migrate import upgrade
    from server.models import GpuSample, PlotView

    settings = ServerSettings(database_url=f"sqlite:///{tmp_path / 'embedded.db'}", broker_url=None,
                              data_dir=tmp_path)
    upgrade(settings)
    engine = make_engine(settings)
    factory = make_sessionmaker(engine)
    with session_scope(factory) as session:
        op, agent = create_token(session, scope="operator"), create_token(session, scope="agent", node="n")
    t0 = time.time() - 7200
    try:
        with TestClient(create_app(settings)) as api:
            _ingest(api, agent, "/api/v1/ingest/samples", sample_batch(node="n", n=900, gpus=2, t0=t0))
            assert api.post("/api/v1/jobs", headers=auth(op), json={
                "job_id": "v", "node": "n", "gpu_uuids": ["GPU-n-0", "GPU-n-1"], "state": "finished",
                "started_at": t0, "ended_at": t0 + 899}).status_code == 200
            assert api.get("/api/v1/jobs/v/report", headers=auth(op)).status_code == 200  # final: views stored
            deadline = time.monotonic() + 30
            while True:  # the background characterization of the end may still be writing its own
                with session_scope(factory) as session:
                    if session.scalar(select(func.count()).select_from(PlotView)) == 1:
                        break
                assert time.monotonic() < deadline
                time.sleep(0.05)
            params = [("metric", "memory_used_bytes"), ("metric", "power_w"), ("points", 100), ("points", 40)]
            stored = api.get("/api/v1/jobs/v/timeseries/batch", params=params, headers=auth(op)).json()
            with session_scope(factory) as session:
                session.execute(delete(PlotView))
            from_samples = api.get("/api/v1/jobs/v/timeseries/batch", params=params, headers=auth(op)).json()
            assert stored == from_samples
            got = [(len(s["values"]), s["raw_points"]) for s in stored["metrics"]["memory_used_bytes"]["series"]]
            assert all(n <= 100 and raw == 900 for n, raw in got), got
            assert api.get("/api/v1/jobs/v/report", params={"refresh": "true"}, headers=auth(op)).status_code == 200
            with session_scope(factory) as session:
                session.execute(delete(GpuSample))
            assert api.get("/api/v1/jobs/v/timeseries/batch", params=params, headers=auth(op)).json() == stored
    finally:
        engine.dispose()
