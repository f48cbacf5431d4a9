"""The job page's download links (dashboard/downloads.py): the artefact fetched with the visitor's token, sent as an
attachment, byte for byte; another team's job and a visitor without a session get no bytes."""

from __future__ import annotations

import gzip
from pathlib import Path

import httpx

from dashboard.pages.job import downloads_section

KINETO = Path(__file__).resolve().parents[1] / "data/kineto/hta/ns_resolution_trace"


def test_download_links_fetch_with_the_session_token(live_server: str, make_token) -> None:
    from dashboard.app import create_dash_app
    from dashboard.session import COOKIE

    vision, nlp = make_token("team", team="vision"), make_token("team", team="nlp")
    body = (KINETO / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz").read_bytes()
    job = "k8s:ml/trainer-0"  # an id with a '/' travels as %2F and still finds its route
    r = httpx.post(f"{live_server}/api/v1/jobs/k8s:ml%2Ftrainer-0/traces", content=body,
                   params={"filename": "rank0.pt.trace.json.gz"},
                   headers={"Authorization": f"Bearer {vision}", "Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text
    (trace,) = httpx.get(f"{live_server}/api/v1/jobs/k8s:ml%2Ftrainer-0/traces",
                         headers={"Authorization": f"Bearer {vision}"}).json()["traces"]

    section = downloads_section(job, [trace])
    hrefs = [a.href for a in _links(section)]
    assert hrefs == ["/download/report/json/k8s:ml%2Ftrainer-0", "/download/report/html/k8s:ml%2Ftrainer-0",
                     f"/download/trace/{trace['trace_id']}/k8s:ml%2Ftrainer-0"]

    client = create_dash_app(live_server, token=None).server.test_client()
    assert client.get(hrefs[2]).status_code == 401  # no session: nothing
    client.set_cookie(COOKIE, vision)
    got = client.get(hrefs[2])
    assert got.status_code == 200 and got.data == body
    assert got.headers["Content-Type"] == "application/gzip"
    assert got.headers["Content-Disposition"] == 'attachment; filename="rank0.pt.trace.json.gz"'
    assert gzip.decompress(got.data).lstrip()[:1] == b"{"
    report = client.get(hrefs[1])
    assert report.status_code == 200 and report.headers["Content-Type"].startswith("text/html")
    assert report.headers["Content-Disposition"] == 'attachment; filename="fleetprof-k8s_ml_trainer-0.html"'
    client.set_cookie(COOKIE, nlp)
    assert client.get(hrefs[2]).status_code == 404  # another team's job


def _links(component):  # type: ignore[no-untyped-def]
    from dash import html

    found = []
    stack = [component]
    while stack:
        c = stack.pop(0)
        if isinstance(c, html.A):
            found.append(c)
        children = getattr(c, "children", None)
        if isinstance(children, list):
            stack[0:0] = children
        elif children is not None and not isinstance(children, str):
            stack.insert(0, children)
    return found
