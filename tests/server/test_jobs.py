"""Jobs: registration, listing with filters, and team isolation."""

from __future__ import annotations

import time

import pytest

from tests.server.helpers import auth, sample_batch

JOBS = "/api/v1/jobs"


def test_register_update_and_read(api, make_token):
    team = make_token("team", team="vision")
    r = api.post(JOBS, json={"job_id": "resnet-1", "name": "resnet50 bs256", "command": "python train.py",
                             "state": "running", "batch_size": 256}, headers=auth(team))
    assert r.status_code == 200, r.text
    assert r.json()["team"] == "vision" and r.json()["state"] == "running" and r.json()["started_at"] is not None
    r = api.post(JOBS, json={"job_id": "resnet-1", "state": "failed", "exit_code": 3}, headers=auth(team))
    body = r.json()
    assert body["state"] == "failed" and body["exit_code"] == 3 and body["name"] == "resnet50 bs256"
    assert body["duration_s"] is not None and body["duration_s"] >= 0


def test_team_isolation(api, make_token):
    vision, nlp = make_token("team", team="vision"), make_token("team", team="nlp")
    sched, op = make_token("scheduler"), make_token("operator")
    assert api.post(JOBS, json={"job_id": "v-1"}, headers=auth(vision)).status_code == 200
    assert api.post(JOBS, json={"job_id": "n-1"}, headers=auth(nlp)).status_code == 200
    # another team's job is indistinguishable from a missing one
    for path in ("/v-1", "/v-1/report", "/v-1/timeseries?metric=power_w"):
        r = api.get(JOBS + path, headers=auth(nlp))
        assert r.status_code == 404 and "not found" in r.json()["detail"]
    assert [j["job_id"] for j in api.get(JOBS, headers=auth(nlp)).json()["items"]] == ["n-1"]
    assert api.get(JOBS, params={"team": "vision"}, headers=auth(nlp)).json()["items"] == []
    # nor can a team take over or register for another team
    assert api.post(JOBS, json={"job_id": "v-1", "name": "mine now"}, headers=auth(nlp)).status_code == 404
    assert api.post(JOBS, json={"job_id": "x-1", "team": "vision"}, headers=auth(nlp)).status_code == 403
    assert {j["job_id"] for j in api.get(JOBS, headers=auth(sched)).json()["items"]} == {"v-1", "n-1"}
    assert api.get(JOBS + "/v-1", headers=auth(op)).json()["name"] is None
    assert api.post(JOBS, json={"job_id": "s-1"}, headers=auth(sched)).status_code == 403
    assert api.get(JOBS).status_code == 401


def test_list_filters_and_pagination(api, make_token):
    op = make_token("operator")
    now = time.time()
    for i in range(5):
        api.post(JOBS, json={"job_id": f"job-{i}", "team": "a" if i % 2 else "b", "state": "finished",
                             "started_at": now - 1000 * (i + 1), "ended_at": now - 1000 * i}, headers=auth(op))
    body = api.get(JOBS, params={"team": "a"}, headers=auth(op)).json()
    assert {j["job_id"] for j in body["items"]} == {"job-1", "job-3"} and body["total"] == 2
    body = api.get(JOBS, params={"since": now - 1500}, headers=auth(op)).json()
    assert {j["job_id"] for j in body["items"]} == {"job-0", "job-1"}
    page = api.get(JOBS, params={"limit": 2, "offset": 2}, headers=auth(op)).json()
    assert len(page["items"]) == 2 and page["total"] == 5
    assert api.get(JOBS, params={"q": "job-4"}, headers=auth(op)).json()["total"] == 1
    assert api.get(JOBS, params={"state": "nonsense"}, headers=auth(op)).status_code == 422
    assert api.get(JOBS, params={"limit": 0}, headers=auth(op)).status_code == 422


def test_bad_job_registrations_are_4xx(api, make_token):
    op = make_token("operator")
    for body in ({"job_id": "has space"}, {"job_id": ""}, {"job_id": "a", "state": "exploded"},
                 {"job_id": "a", "batch_size": -1}, {"job_id": "a", "gpu_uuids": ["GPU-1"]},
                 {"job_id": "a", "started_at": 100.0, "ended_at": 50.0}, {"job_id": "a", "started_at": 1e12},
                 {"job_id": "a", "unknown_field": 1}):
        r = api.post(JOBS, json=body, headers=auth(op))
        assert 400 <= r.status_code < 500, (body, r.text)
    r = api.post(JOBS, json={"job_id": "a", "started_at": time.time(), "ended_at": time.time() - 10},
                 headers=auth(op))
    assert r.status_code == 422 and "before" in r.json()["detail"]
    assert api.get(JOBS, headers=auth(op)).json()["total"] == 0


def test_timeseries_is_downsampled_with_extremes_kept(api, make_token):
    agent, op = make_token("agent", node="node-a"), make_token("operator")
    t0 = time.time() - 7200
    api.post(JOBS, json={"job_id": "ts-1", "node": "node-a", "gpu_uuids": ["GPU-node-a-0", "GPU-node-a-1"],
                         "started_at": t0, "state": "running"}, headers=auth(op))
    for seq in range(5):
        r = api.post("/api/v1/ingest/samples", json=sample_batch(seq=seq, n=400, t0=t0 + 400 * seq),
                     headers=auth(agent))
        assert r.status_code == 200
    r = api.get(JOBS + "/ts-1/timeseries", params={"metric": "memory_used_bytes", "points": 100}, headers=auth(op))
    body = r.json()
    assert body["unit"] == "B" and len(body["series"]) == 2
    for s in body["series"]:
        assert s["raw_points"] == 2000 and len(s["ts"]) <= 100
        assert max(s["values"]) == s["max"] and min(s["values"]) == s["min"]
    assert api.get(JOBS + "/ts-1/timeseries", params={"metric": "bogus"}, headers=auth(op)).status_code == 422


def test_a_registration_is_committed_before_its_answer_is_sent(server_settings, pg_engine, make_token):
    """A client that reads its 200 may act on it at once (the hooks upload a trace for the job they just
    registered): the write must be visible to every other connection before the first byte of the answer."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from server.app import create_app

    seen_at_response_start: list[int] = []
    app = create_app(server_settings)

    def visible_when_answering(inner):  # type: ignore[no-untyped-def]
        async def asgi(scope, receive, send):  # type: ignore[no-untyped-def]
            async def watching_send(message):  # type: ignore[no-untyped-def]
                if message["type"] == "http.response.start" and scope["path"] == "/api/v1/jobs":
                    with pg_engine.connect() as conn:  # another connection: sees committed rows only
                        seen_at_response_start.append(conn.execute(
                            text("SELECT count(*) FROM jobs WHERE job_id = 'visible-1'")).scalar_one())
                await send(message)

            await inner(scope, receive, watching_send)
        return asgi

    operator = make_token("operator")
    with TestClient(visible_when_answering(app)) as client:
        r = client.post("/api/v1/jobs", json={"job_id": "visible-1", "team": "alpha", "state": "running"},
                        headers=auth(operator))
    assert r.status_code == 200, r.text
    assert seen_at_response_start == [1]


def test_the_same_job_created_by_two_requests_at_once_is_one_job(server_settings, pg_engine, make_token):
    """Two sessions create one job_id concurrently (registration racing a trace upload): the second waits for
    the first and takes its row instead of failing on the unique job_id."""
    import threading

    from server.auth.service import Principal
    from server.db import make_engine, make_sessionmaker
    from server.jobs import service as job_service
    from server.jobs.schemas import JobCreate

    engine = make_engine(server_settings)
    factory = make_sessionmaker(engine)
    operator = Principal(token_id=0, scope="operator")
    first, second = factory(), factory()
    try:
        job_a, _ = job_service.upsert_job(first, JobCreate(job_id="raced", team="alpha"), principal=operator)
        done: list[object] = []
        t = threading.Thread(target=lambda: done.append(
            job_service.get_writable_job(second, job_id="raced", principal=operator)))
        t.start()
        t.join(1.0)
        assert t.is_alive()  # waiting on the first's uncommitted row, not failing
        first.commit()
        t.join(10)
        assert not t.is_alive() and len(done) == 1
        assert done[0].id == job_a.id and done[0].team == "alpha"
        second.commit()
    finally:
        first.close()
        second.close()
        engine.dispose()
    with pg_engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM jobs WHERE job_id = 'raced'")).scalar_one() == 1


def test_report_has_per_process_peaks_from_the_agents_process_rows(api, make_token):
    """Process rows as the agent sends them (attributed by FLEETPROF_JOB_ID, plus a co-tenant nobody claimed): the
    report's per-process peaks are the maxima of what was sent, the job's processes apart from the others."""
    agent = make_token("agent", node="node-p")
    operator = make_token("operator")
    t0 = time.time() - 120
    batch = sample_batch(node="node-p", n=20, gpus=2, t0=t0)
    ts, uuid, pid, used, job, how = [], [], [], [], [], []
    for k in range(20):
        for gpu, rank_pid in ((0, 4100), (1, 4101)):
            ts.append(t0 + k), uuid.append(f"GPU-node-p-{gpu}"), pid.append(rank_pid)
            used.append((20_000 + 100 * k + gpu) * 2**20), job.append("proc-job"), how.append("env:FLEETPROF_JOB_ID")
        if 5 <= k < 10:  # a co-tenant on GPU 0 for a few seconds
            ts.append(t0 + k), uuid.append("GPU-node-p-0"), pid.append(777)
            used.append((500 + k) * 2**20), job.append(None), how.append(None)
    batch["processes"] = {"ts": ts, "gpu_uuid": uuid, "pid": pid, "used_memory_bytes": used, "job_id": job,
                          "attribution": how}
    r = api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent))
    assert r.status_code == 200, r.text
    # The job exists from its processes' attribution (an agent saw it, nobody registered it); end it now.
    r = api.post("/api/v1/jobs", json={"job_id": "proc-job", "state": "finished", "ended_at": t0 + 20},
                 headers=auth(operator))
    assert r.status_code == 200, r.text
    report = api.get("/api/v1/jobs/proc-job/report", params={"refresh": "true"}, headers=auth(operator)).json()
    mem = report["memory"]
    assert mem["process_peak_bytes"] == (20_000 + 100 * 19 + 1) * 2**20
    assert mem["job_processes"] == 2 and mem["other_processes"] == 1
    assert mem["other_processes_peak_bytes"] == 509 * 2**20
    rows = {(p["gpu_uuid"], p["pid"]): p for p in mem["processes"]}
    assert rows[("GPU-node-p-0", 4100)]["peak_used_bytes"] == (20_000 + 1900) * 2**20
    assert rows[("GPU-node-p-0", 777)]["job_id"] is None and rows[("GPU-node-p-0", 4100)]["job_id"] == "proc-job"
    assert rows[("GPU-node-p-0", 777)]["first_seen"] == pytest.approx(t0 + 5, abs=1e-3)
    assert report["sources"]["memory.process_peak_bytes"].startswith("nvml")


def test_an_end_reported_as_failed_is_oom_when_the_hooks_saw_one(api, make_token):
    """The Slurm epilog knows an exit status only: a job whose hooks reported CUDA out of memory ends 'oom', as it
    did when the hooks themselves reported the end (before, a registration's 'failed' stayed 'failed')."""
    from fleetprof.protocol import PROTOCOL_VERSION

    team, agent = make_token("team", team="vision"), make_token("agent", node="node-o")
    now = time.time()
    assert api.post("/api/v1/jobs", json={"job_id": "slurm:55", "team": "vision", "state": "running", "node": "node-o"},
                    headers=auth(agent)).status_code == 200
    events = {"protocol_version": PROTOCOL_VERSION, "source_id": "hooks-55", "seq": 0, "sent_at": now,
              "events": [{"kind": "oom", "job_id": "slurm:55", "ts": now, "message": "CUDA out of memory"}]}
    assert api.post("/api/v1/ingest/events", json=events, headers=auth(team)).status_code == 200
    r = api.post("/api/v1/jobs", json={"job_id": "slurm:55", "state": "failed", "exit_code": 1}, headers=auth(agent))
    assert r.status_code == 200 and r.json()["state"] == "oom", r.text
