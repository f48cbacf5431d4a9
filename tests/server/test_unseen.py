"""Jobs the agents no longer see are ended by the server (server.jobs.unseen), against the real Postgres: ended at
their last sighting with the reason, given their final report, and their GPUs' later samples are not theirs."""

from __future__ import annotations

import time

import pytest

from server.db import make_engine, make_sessionmaker, session_scope
from server.jobs import report_store, sweep
from server.jobs.unseen import end_unseen_jobs
from server.models import Job
from tests.server.helpers import auth, sample_batch

SAMPLES = "/api/v1/ingest/samples"


def _with_processes(batch: dict, job_id: str | None, *, until_k: int | None = None, pid: int = 4242,
                    how: str = "env:SLURM_JOB_ID") -> dict:
    """Process rows on GPU 0 of `batch` for its samples up to `until_k` seconds after its start."""
    ts, uuids = batch["samples"]["ts"], batch["samples"]["gpu_uuid"]
    t0 = min(ts)
    end = t0 + until_k if until_k is not None else float("inf")
    rows = [(t, u) for t, u in zip(ts, uuids, strict=True) if u.endswith("-0") and t < end]
    batch["processes"] = {"ts": [t for t, _ in rows], "gpu_uuid": [u for _, u in rows], "pid": [pid] * len(rows),
                          "used_memory_bytes": [2**30] * len(rows), "job_id": [job_id] * len(rows),
                          "attribution": [how if job_id else None] * len(rows)}
    return batch


@pytest.fixture
def factory(server_settings):
    engine = make_engine(server_settings)
    yield make_sessionmaker(engine)
    engine.dispose()


def _sweep(factory, timeout_s: float = 900.0) -> list[int]:  # type: ignore[no-untyped-def]
    with session_scope(factory) as session:
        return end_unseen_jobs(session, timeout_s=timeout_s)


@pytest.mark.parametrize(("job_id", "how"), [("slurm:900", "env:SLURM_JOB_ID"),
                                             ("k8s:pod-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "k8s:pod")])
def test_a_job_no_longer_seen_is_ended_reported_and_gives_up_its_gpus(api, make_token, factory, server_settings,
                                                                      job_id, how):
    """A Slurm job whose epilog never ran (its node died), or a pod that ended (pods tell nobody)."""
    agent, operator = make_token("agent", node="node-u"), make_token("operator")
    t0 = time.time() - 3600
    # The job's processes are on GPU 0 for its first 20 s; the GPU goes on being sampled for 60 s (memory grows
    # with every sample: a peak taken from a later sample would show).
    batch = _with_processes(sample_batch(node="node-u", n=60, gpus=2, t0=t0), job_id, until_k=20, how=how)
    assert api.post(SAMPLES, json=batch, headers=auth(agent)).status_code == 200
    # slurm:901 was seen a minute ago: not stale.
    recent = _with_processes(sample_batch(node="node-u", seq=1, n=3, gpus=2, t0=time.time() - 60), "slurm:901")
    assert api.post(SAMPLES, json=recent, headers=auth(agent)).status_code == 200
    # registered, never seen on a GPU: the agents attributed nothing to it, so nothing says it is gone
    assert api.post("/api/v1/jobs", json={"job_id": "registered-only", "state": "running"},
                    headers=auth(operator)).status_code == 200

    assert _sweep(factory, timeout_s=0) == []  # 0 = never
    ended = _sweep(factory)
    with session_scope(factory) as session:
        jobs = {j.job_id: j for j in session.query(Job)}
        assert ended == [jobs[job_id].id]
        assert jobs["slurm:901"].state == "running" and jobs["registered-only"].state == "running"

    job = api.get(f"/api/v1/jobs/{job_id}", headers=auth(operator)).json()
    assert job["state"] == "lost"
    assert job["ended_at"] == pytest.approx(t0 + 19, abs=1e-3)  # its last sighting, not the sweep's time
    assert "no process of this job seen" in job["end_reason"] and "900 s" in job["end_reason"]
    assert _sweep(factory) == []  # done once

    # The characterization sweep gives it its final report, from its own 20 s of GPU 0 only.
    with session_scope(factory) as session:
        due = sweep.jobs_due(session, every_s=60)
    assert jobs[job_id].id in due
    assert report_store.characterize_job_pk(factory, jobs[job_id].id, server_settings)
    with session_scope(factory) as session:
        row = session.get(Job, jobs[job_id].id)
        cached = report_store.cached_report(session, row)
        assert cached is not None and report_store.is_final(cached, row)
        report = cached.data
    assert report["state"] == "lost"
    assert report["duration_s"] == pytest.approx(19, abs=0.01)
    assert [g["uuid"] for g in report["gpus"]] == ["GPU-node-u-0"]
    # sample_batch: GPU 0 uses (1000 + 10 k) MiB at second k; the job's last one is k = 19, the GPU's k = 59
    assert report["memory"]["peak_used_bytes"] == (1000 + 10 * 19) * 2**20


def test_a_lost_job_seen_again_runs_again_and_a_scheduler_end_replaces_the_guess(api, make_token, factory):
    agent, operator = make_token("agent", node="node-u"), make_token("operator")
    t0 = time.time() - 3600
    batch = _with_processes(sample_batch(node="node-u", n=10, gpus=1, t0=t0), "slurm:77")
    assert api.post(SAMPLES, json=batch, headers=auth(agent)).status_code == 200
    assert len(_sweep(factory)) == 1
    # the agent was cut off longer than the timeout: its spool brings rows from after the end the server gave
    late = _with_processes(sample_batch(node="node-u", seq=1, n=5, gpus=1, t0=t0 + 1200), "slurm:77")
    assert api.post(SAMPLES, json=late, headers=auth(agent)).status_code == 200
    job = api.get("/api/v1/jobs/slurm:77", headers=auth(operator)).json()
    assert job["state"] == "running" and job["ended_at"] is None and job["end_reason"] is None

    assert len(_sweep(factory)) == 1  # lost again
    # registered running again (a prolog re-run, `fleetprof up` restarted hours later with its demo job): no end
    r = api.post("/api/v1/jobs", json={"job_id": "slurm:77", "state": "running", "started_at": time.time()},
                 headers=auth(operator))
    assert r.status_code == 200 and r.json()["ended_at"] is None and r.json()["end_reason"] is None, r.text
    assert _sweep(factory) == []  # (re)started now: its timeout counts from its start
    r = api.post("/api/v1/jobs", json={"job_id": "slurm:77", "state": "failed", "exit_code": 3},
                 headers=auth(operator))
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "failed" and r.json()["end_reason"] is None


def test_a_registered_slurm_job_whose_epilog_never_ran_is_ended(api, make_token, factory):
    """The prolog registered the job with its GPUs (registered links), then the node died: the agent's sightings of
    its processes on those GPUs are what ends it (before, registered links never recorded them: never ended)."""
    agent, operator = make_token("agent", node="node-u"), make_token("operator")
    t0 = time.time() - 3600
    r = api.post("/api/v1/jobs", json={"job_id": "slurm:31", "state": "running", "started_at": t0, "node": "node-u",
                                       "gpu_uuids": ["GPU-node-u-0"]}, headers=auth(agent))
    assert r.status_code == 200, r.text
    batch = _with_processes(sample_batch(node="node-u", n=30, gpus=1, t0=t0), "slurm:31", until_k=10)
    assert api.post(SAMPLES, json=batch, headers=auth(agent)).status_code == 200
    assert len(_sweep(factory)) == 1
    job = api.get("/api/v1/jobs/slurm:31", headers=auth(operator)).json()
    assert job["state"] == "lost" and job["ended_at"] == pytest.approx(t0 + 9, abs=1e-3)
