"""Live captures (issue #19): the REST contract (scopes, 202/200/404/409/422, nothing created on a 4xx), the state
machine, the trace upload that completes a capture, the automatic capture on a step-time regression, the report's
section and the CLI."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetprof.protocol import PROTOCOL_VERSION
from tests.server.helpers import auth

KINETO = Path(__file__).resolve().parents[1] / "data/kineto"


def _job(api, token, job_id, state="running"):  # type: ignore[no-untyped-def]
    r = api.post("/api/v1/jobs", json={"job_id": job_id, "state": state}, headers=auth(token))
    assert r.status_code == 200, r.text


def _captures(api, token, job_id, **params):  # type: ignore[no-untyped-def]
    r = api.get(f"/api/v1/jobs/{job_id}/captures", params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()["captures"]


def _request(api, token, job_id, **body):  # type: ignore[no-untyped-def]
    return api.post(f"/api/v1/jobs/{job_id}/captures", json={"kind": "kineto", "steps": 3, **body},
                    headers=auth(token))


def test_scopes_and_refusals_create_nothing(api, make_token):
    team, other, operator = make_token("team", team="nlp"), make_token("team", team="cv"), make_token("operator")
    scheduler = make_token("scheduler")
    _job(api, team, "cap-1")
    r = _request(api, team, "cap-1", ranks=[1, 0])
    assert r.status_code == 202, r.text
    c = r.json()
    assert c["job_id"] == "cap-1" and c["state"] == "requested" and c["ranks"] == [1, 0] and c["steps"] == 3
    assert c["trigger"]["kind"] == "manual" and c["requested_by"] == "team:nlp" and c["trace_ids"] == []
    assert c["requested_at"].endswith("Z") and c["delivered_at"] is None
    assert _request(api, operator, "cap-1", kind="allocator", ranks=None).status_code == 202
    assert _request(api, other, "cap-1").status_code == 404  # another team's job: as if it did not exist
    assert api.get("/api/v1/jobs/cap-1/captures", headers=auth(other)).status_code == 404
    assert _request(api, scheduler, "cap-1").status_code == 403
    assert _request(api, team, "no-such-job").status_code == 404
    for bad in ({"steps": 0}, {"steps": 1000}, {"kind": "nsys"}, {"ranks": [-1]}, {"ranks": []}, {"ranks": "0"},
                {"extra": 1}):
        r = _request(api, team, "cap-1", **bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    _job(api, team, "cap-done", state="finished")
    r = _request(api, team, "cap-done")
    assert r.status_code == 409 and r.headers["content-type"].startswith("application/problem+json")
    assert _captures(api, operator, "cap-done") == []
    listed = _captures(api, team, "cap-1")
    assert [x["kind"] for x in listed] == ["allocator", "kineto"]  # newest first; nothing from the refusals
    assert [x["capture_id"] for x in _captures(api, team, "cap-1", state="requested")] == \
        [x["capture_id"] for x in listed]
    assert _captures(api, team, "cap-1", state="analyzed") == []
    assert api.get("/api/v1/jobs/cap-1/captures", params={"state": "nope"}, headers=auth(team)).status_code == 422


def test_state_machine(api, make_token):
    team, other = make_token("team", team="nlp"), make_token("team", team="cv")
    _job(api, team, "cap-sm")
    cid = _request(api, team, "cap-sm").json()["capture_id"]
    url = f"/api/v1/jobs/cap-sm/captures/{cid}/state"

    def report(state, token=team, **extra):  # type: ignore[no-untyped-def]
        return api.post(url, json={"state": state, **extra}, headers=auth(token))

    assert report("capturing").status_code == 409  # requested -> capturing skips delivered
    assert report("delivered", token=other).status_code == 404
    assert api.post("/api/v1/jobs/cap-sm/captures/nope/state", json={"state": "delivered"},
                    headers=auth(team)).status_code == 404
    assert report("uploaded").status_code == 422  # set by the upload, never reported
    assert report("failed").status_code == 422  # a failure needs its reason
    r = report("delivered", rank=0)
    assert r.status_code == 200 and r.json()["state"] == "delivered" and r.json()["delivered_at"]
    assert report("delivered", rank=1).status_code == 200  # another rank saying the same
    assert report("capturing").json()["state"] == "capturing"
    assert report("delivered").status_code == 409  # no going back
    r = report("failed", reason="allocator captures need CUDA", rank=1)
    assert r.status_code == 200 and r.json()["state"] == "failed" and "need CUDA" in r.json()["reason"]
    assert r.json()["failed_at"] and r.json()["capturing_at"]
    assert report("failed", reason="again").status_code == 409  # final
    assert report("capturing").status_code == 409
    assert _captures(api, team, "cap-sm")[0]["state"] == "failed"


def test_every_rank_of_a_multi_rank_capture_sees_it(api, make_token):
    """The hooks poll `?state=requested&rank=R`: a capture of ranks [0, 1] taken by rank 0 stays pending for rank 1
    (and for no one else), until rank 1 takes it too."""
    team = make_token("team", team="nlp")
    _job(api, team, "cap-ranks")
    cid = _request(api, team, "cap-ranks", ranks=[0, 1]).json()["capture_id"]
    assert [c["capture_id"] for c in _captures(api, team, "cap-ranks", state="requested", rank=2)] == []
    r = api.post(f"/api/v1/jobs/cap-ranks/captures/{cid}/state", json={"state": "delivered", "rank": 0},
                 headers=auth(team))
    assert r.status_code == 200 and r.json()["state"] == "delivered"
    assert _captures(api, team, "cap-ranks", state="requested", rank=0) == []  # rank 0 has it
    assert [c["capture_id"] for c in _captures(api, team, "cap-ranks", state="requested", rank=1)] == [cid]
    assert _captures(api, team, "cap-ranks", state="requested") == []  # without a rank: the state alone
    r = api.post(f"/api/v1/jobs/cap-ranks/captures/{cid}/state", json={"state": "delivered", "rank": 1},
                 headers=auth(team))
    assert r.status_code == 200
    assert _captures(api, team, "cap-ranks", state="requested", rank=1) == []


def test_upload_with_capture_id_links_and_analyzes(api, make_token):
    team, other = make_token("team", team="nlp"), make_token("team", team="cv")
    _job(api, team, "cap-up")
    _job(api, other, "cap-other")
    cid = _request(api, team, "cap-up", ranks=[0]).json()["capture_id"]
    body = (KINETO / "hta/nccl_parser_config/nccl_data.json.gz").read_bytes()
    headers = {**auth(team), "Content-Type": "application/gzip"}
    # a capture of another job (or none) is refused before anything is stored
    assert api.post("/api/v1/jobs/cap-up/traces", content=body, params={"capture_id": "nope"},
                    headers=headers).status_code == 404
    other_cid = _request(api, other, "cap-other").json()["capture_id"]
    assert api.post("/api/v1/jobs/cap-up/traces", content=body, params={"capture_id": other_cid},
                    headers=headers).status_code == 404
    bad = api.post("/api/v1/jobs/cap-up/traces", content=b"not json", params={"capture_id": cid},
                   headers={**auth(team), "Content-Type": "application/json"})
    assert bad.status_code == 422
    [failed] = _captures(api, team, "cap-up")
    assert failed["state"] == "failed" and failed["reason"].startswith("analysis failed")
    cid = _request(api, team, "cap-up", ranks=[0]).json()["capture_id"]
    r = api.post("/api/v1/jobs/cap-up/traces", content=body, params={"capture_id": cid, "filename": "x.json.gz"},
                 headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["capture_id"] == cid
    c = _captures(api, team, "cap-up")[0]
    assert c["capture_id"] == cid and c["state"] == "analyzed" and len(c["trace_ids"]) == 1
    assert c["uploaded_at"] and c["analyzed_at"]
    report = api.get("/api/v1/jobs/cap-up/report", headers=auth(team)).json()
    entries = report["captures"]["captures"]
    assert [e["capture_id"] for e in entries][0] == cid
    b = entries[0]["breakdown"]
    assert b is not None and b["compute_pct"] is not None
    assert report["traces"] is None or report["traces"]["kineto_files"] == 0  # shown per capture only
    # a second capture of the same rank is not refused as a duplicate rank
    cid2 = _request(api, team, "cap-up", ranks=[0]).json()["capture_id"]
    again = api.post("/api/v1/jobs/cap-up/traces", content=body, params={"capture_id": cid2}, headers=headers)
    assert again.status_code == 200 and _captures(api, team, "cap-up")[0]["state"] == "analyzed"


def _steps(job_id, rank, first, walls, t0):  # type: ignore[no-untyped-def]
    return [{"kind": "step", "job_id": job_id, "rank": rank, "step": first + i, "ts": t0 + first + i, "wall_s": w}
            for i, w in enumerate(walls)]


def _send(api, token, events, seq):  # type: ignore[no-untyped-def]
    r = api.post("/api/v1/ingest/events", headers=auth(token),
                 json={"protocol_version": PROTOCOL_VERSION, "source_id": "hooks-test", "seq": seq,
                       "sent_at": time.time(), "events": events})
    assert r.status_code == 200, r.text


def test_automatic_capture_on_a_step_time_regression(api, make_token, server_settings):
    # defaults: 10 warm-up steps, a baseline of 50, a recent window of 20, factor 1.5, one per hour
    team = make_token("team", team="nlp")
    _job(api, team, "cap-auto")
    t0 = time.time() - 3600
    _send(api, team, _steps("cap-auto", 0, 0, [0.5] * 10 + [0.1] * 90, t0), 0)
    assert _captures(api, team, "cap-auto") == []  # steady: nothing
    _send(api, team, _steps("cap-auto", 0, 100, [0.2] * 30, t0), 1)  # 2x slower
    [auto] = _captures(api, team, "cap-auto")
    trig = auto["trigger"]
    assert trig["kind"] == "step_time_regression" and auto["kind"] == "kineto" and auto["requested_by"] is None
    assert trig["baseline_median_step_s"] == pytest.approx(0.1) and trig["recent_median_step_s"] == pytest.approx(0.2)
    assert trig["factor"] == pytest.approx(2.0) and trig["baseline_steps"] == [10, 59]
    assert trig["recent_steps"] == [110, 129] and "2.00x" in trig["summary"]
    _send(api, team, _steps("cap-auto", 0, 130, [0.4] * 30, t0), 2)  # slower again, within the hour: no second one
    assert len(_captures(api, team, "cap-auto")) == 1
    # a manual capture does not count against the interval, nor reset it
    assert _request(api, team, "cap-auto").status_code == 202
    assert len(_captures(api, team, "cap-auto")) == 2
    report = api.get("/api/v1/jobs/cap-auto/report", headers=auth(team)).json()
    [entry] = [e for e in report["captures"]["captures"] if e["trigger_kind"] == "step_time_regression"]
    assert entry["comparison"]["factor"] == pytest.approx(2.0) and entry["breakdown"] is None


def test_automatic_capture_goes_to_the_straggler_and_a_healthy_peer(api, make_token, db_session):
    from server.captures import auto
    from server.config import ServerSettings
    from server.jobs import service as job_service
    from server.models import Job, Report

    team = make_token("team", team="nlp")
    _job(api, team, "cap-strag")
    t0 = time.time() - 3600
    _send(api, team, _steps("cap-strag", 0, 0, [0.1] * 60, t0) + _steps("cap-strag", 1, 0, [0.1] * 60, t0), 0)
    api.get("/api/v1/jobs/cap-strag/report", headers=auth(team))  # a report to read the stragglers from
    job = job_service.find_job(db_session, "cap-strag")
    assert isinstance(job, Job)
    row = db_session.query(Report).filter_by(job_pk=job.id).one()
    data = dict(row.data)
    data["time"] = {**data["time"], "stragglers": {"ranks": 2, "median_step_s": 0.1, "stragglers": [
        {"rank": 1, "gpu_uuid": None, "median_step_s": 0.3, "slowdown_fraction": 2.0}]}}
    row.data = data
    db_session.commit()
    settings = ServerSettings(database_url="postgresql://unused", capture_warmup_steps=0, capture_baseline_steps=10,
                              capture_recent_steps=5)
    db_session.execute(Job.__table__.update().where(Job.id == job.id).values(state="running"))
    _send(api, team, _steps("cap-strag", 0, 60, [0.3] * 10, t0), 1)  # the app's defaults need more steps
    capture = auto.check_job(db_session, job=job, rank=0, settings=settings)
    assert capture is not None and capture.ranks == [1, 0] and capture.trigger["kind"] == "straggler"
    assert capture.trigger["straggler_rank"] == 1 and capture.trigger["healthy_rank"] == 0
    db_session.commit()
    assert auto.check_job(db_session, job=job, rank=0, settings=settings) is None  # within the interval


def test_cli_capture(api, make_token, live_server, cli_env):
    team = make_token("team", team="nlp")
    _job(api, team, "cap-cli")
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": team}

    def cli(*args):  # type: ignore[no-untyped-def]
        return subprocess.run([sys.executable, "-m", "fleetprof.cli", "capture", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    ok = cli("cap-cli", "--kind", "allocator", "--steps", "4", "--ranks", "0,1")
    assert ok.returncode == 0, ok.stderr
    cid, state = ok.stdout.split()
    assert state == "requested"
    [c] = _captures(api, team, "cap-cli")
    assert c["capture_id"] == cid and c["kind"] == "allocator" and c["steps"] == 4 and c["ranks"] == [0, 1]
    waited = cli("cap-cli", "--wait", "0.5")
    assert waited.returncode == 0 and waited.stdout.split()[1] == "requested"
    for args, code in ((("cap-cli", "--steps", "0"), 2), (("cap-cli", "--ranks", "a"), 2),
                       (("no-such-job",), 3), (("cap-cli", "--kind", "nsys"), 2)):
        r = cli(*args)
        assert r.returncode == code, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
    assert len(cli("no-such-job").stderr.strip().splitlines()) == 1  # an API error: one line
    _job(api, team, "cap-cli", state="finished")
    ended = cli("cap-cli")
    assert ended.returncode == 6 and "ended" in ended.stderr
    assert len(_captures(api, team, "cap-cli")) == 2
