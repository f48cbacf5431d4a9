"""Every job route addresses every valid job id: `/` (Kubernetes) travels as %2F, and `:` `_` `+` `.` `@` `=`
as they are (fleetprof/jobid.py, server/job_paths.py)."""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

import pytest

from fleetprof.jobid import job_path, k8s_job_id
from tests.server.helpers import auth, gz, sample_batch

IDS = ["k8s:ns/pod-abc", "slurm:123_4", "slurm:123+0", "alice.b@c:run=1",
       k8s_job_id("n" * 63, "p" * 253)]  # the longest Kubernetes names: shortened to 200 characters
TRACE = gzip.compress(json.dumps({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": 1000, "dur": 500, "pid": 0, "tid": 7,
     "args": {"device": 0, "stream": 7}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 990, "dur": 20, "pid": 1, "tid": 1}]}).encode())


def _post_gz(api, token: str, path: str, payload: object) -> None:  # type: ignore[no-untyped-def]
    r = api.post(path, content=gz(payload), headers={**auth(token), "Content-Encoding": "gzip",
                                                     "Content-Type": "application/json"})
    assert r.status_code < 300, r.text


def seed(api, make_token, job_ids: list[str]) -> str:  # type: ignore[no-untyped-def]
    """Each id a finished job of team t on a node of its own: 60 s of samples on 1 GPU and 10 steps."""
    team, operator = make_token("team", team="t"), make_token("operator")
    t0 = time.time() - 3600
    for i, job_id in enumerate(job_ids):
        node = f"n{i}"
        _post_gz(api, make_token("agent", node=node), "/api/v1/ingest/samples",
                 sample_batch(node=node, agent_id=f"a{i}", n=60, gpus=1, t0=t0))
        # registered by an operator: a team token may attach only GPUs the agent attributed to it (issue 15)
        r = api.post("/api/v1/jobs", headers=auth(operator), json={
            "job_id": job_id, "team": "t", "name": "train", "node": node, "gpu_uuids": [f"GPU-{node}-0"],
            "state": "finished", "started_at": t0, "ended_at": t0 + 59})
        assert r.status_code == 200 and r.json()["job_id"] == job_id, r.text
        events = [{"kind": "step", "job_id": job_id, "step": s, "ts": t0 + 5.0 * (s + 1), "wall_s": 5.0}
                  for s in range(10)]
        _post_gz(api, team, "/api/v1/ingest/events",
                 {"protocol_version": 1, "source_id": f"hooks-{i}", "seq": 0, "sent_at": time.time(), "events": events})
    return team


def check_every_route(client: Any, headers: dict[str, str], job_id: str) -> None:
    """GET/POST every job route for a `seed`ed `job_id` through `client` (a TestClient, or an httpx.Client on a
    live server: uvicorn decodes the path as TestClient does not quite)."""
    answers = {
        "job": client.get(job_path(job_id), headers=headers),
        "report": client.get(job_path(job_id, "report"), headers=headers),
        "timeseries": client.get(job_path(job_id, "timeseries"), params={"metric": "power_w"}, headers=headers),
        "timeseries/batch": client.get(job_path(job_id, "timeseries", "batch"),
                                       params={"metric": ["power_w", "gpu_util_pct"]}, headers=headers),
        "steps": client.get(job_path(job_id, "steps"), headers=headers),
        "rightsizing": client.get(job_path(job_id, "rightsizing"), headers=headers),
    }
    for name, r in answers.items():
        assert r.status_code == 200, (name, r.text)
        assert r.json()["job_id"] == job_id, name
    assert answers["steps"].json()["count"] == 10
    assert answers["timeseries"].json()["series"][0]["raw_points"] == 60
    html = client.get(job_path(job_id, "report"), params={"format": "html"}, headers=headers)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert f"<small>{job_id}</small>" in html.text
    trace = client.post(job_path(job_id, "traces"), content=TRACE, params={"filename": "rank0.json.gz"},
                        headers={**headers, "Content-Type": "application/gzip"})
    assert trace.status_code == 200 and trace.json()["job_id"] == job_id, trace.text


@pytest.mark.parametrize("job_id", IDS)
def test_every_job_route_addresses_the_id(api, make_token, job_id: str) -> None:
    team = seed(api, make_token, [job_id])
    check_every_route(api, auth(team), job_id)
    listed = api.get("/api/v1/jobs", params={"q": job_id}, headers=auth(team)).json()
    assert [j["job_id"] for j in listed["items"]] == [job_id]


def test_an_encoded_slash_names_one_job_and_a_bare_one_a_sub_resource(api, make_token) -> None:
    """Jobs `k8s:ns` and `k8s:ns/report` (a pod named "report"): each path names exactly one of them."""
    team = seed(api, make_token, ["k8s:ns", "k8s:ns/report"])
    h = auth(team)
    assert job_path("k8s:ns/report") == "/api/v1/jobs/k8s:ns%2Freport"
    pod = api.get(job_path("k8s:ns/report"), headers=h)
    assert pod.status_code == 200 and pod.json()["job_id"] == "k8s:ns/report" and "memory" not in pod.json()
    report = api.get("/api/v1/jobs/k8s:ns/report", headers=h)  # a bare '/': job k8s:ns's report
    assert report.status_code == 200 and report.json()["job_id"] == "k8s:ns" and "memory" in report.json()
    assert api.get("/api/v1/jobs/k8s:ns/report/report", headers=h).status_code == 404
    lower = api.get("/api/v1/jobs/k8s:ns%2freport", headers=h)
    assert lower.status_code == 200 and lower.json()["job_id"] == "k8s:ns/report"
    compared = api.get("/api/v1/jobs/compare", params={"ids": "k8s:ns,k8s:ns/report"}, headers=h)
    assert compared.status_code == 200, compared.text


def test_a_live_server_routes_every_id(api, make_token, live_server: str) -> None:
    """Through uvicorn (what decodes the path in production): every route, every id, and %25 decoded once."""
    import httpx

    team = seed(api, make_token, [*IDS, "k8s:ns"])  # the TestClient and the live server share the database
    with httpx.Client(base_url=live_server, timeout=60) as client:
        for job_id in IDS:
            check_every_route(client, auth(team), job_id)
        assert client.get("/api/v1/jobs/k8s:ns%252Fpod-abc", headers=auth(team)).status_code == 404
        assert client.get("/api/v1/jobs/k8s:ns%2Fpod-abc", headers=auth(team)).json()["job_id"] == "k8s:ns/pod-abc"
        bare = client.get("/api/v1/jobs/k8s:ns/pod-abc", headers=auth(team))  # no such route: how to write it
        assert bare.status_code == 404 and "k8s:ns%2Fpod-abc" in bare.json()["detail"]


def test_openapi_and_metrics_keep_the_contracts_paths(api, make_token) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/report", "/api/v1/jobs/{job_id}/timeseries",
                 "/api/v1/jobs/{job_id}/timeseries/batch", "/api/v1/jobs/{job_id}/steps",
                 "/api/v1/jobs/{job_id}/rightsizing", "/api/v1/jobs/{job_id}/traces"):
        assert path in paths, path
    assert not [p for p in paths if ":job_id" in p or "{rest" in p]
    assert api.get(job_path("k8s:ns/none"), headers=auth(make_token("operator"))).status_code == 404
    metrics = api.get("/metrics").text  # the latency label is the contract's path too
    assert 'route="/api/v1/jobs/{job_id}"' in metrics and "job_id:job_id" not in metrics


@pytest.mark.parametrize("bad", ["a b", "k8s:ns/..", "a//b", "/a", "x" * 201, "a,b", "tab\there"])
def test_registering_an_invalid_id_is_a_422_that_says_why(api, make_token, bad: str) -> None:
    r = api.post("/api/v1/jobs", headers=auth(make_token("team", team="t")), json={"job_id": bad, "team": "t"})
    assert r.status_code == 422, r.text
    assert "pattern" not in r.text  # the grammar's own words, not its regex
