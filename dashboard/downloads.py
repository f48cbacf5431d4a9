"""Download links of the job page: the dashboard fetches the artefact from the API with the visitor's session token
and hands it to the browser as an attachment (the API wants a bearer token, which a link cannot carry).

    /download/report/<json|html>/<job id>        the report (fleetprof-<job id>.json / .html)
    /download/trace/<trace id>/<job id>          a Kineto trace as uploaded (Perfetto, TensorBoard), a snapshot as
                                                 torch's pickle (pytorch.org/memory_viz)

The job id comes last (`path`): a Kubernetes id holds a '/'. The API decides who may read what (its 404s and 401s
come back as they are).
"""

from __future__ import annotations

from typing import Any

from flask import Response

from dashboard.client import ApiError
from dashboard.components import client_for
from fleetprof.jobid import job_path, path_segment

PREFIX = "/download"


def report_href(job_id: str, fmt: str) -> str:
    return f"{PREFIX}/report/{fmt}/{path_segment(job_id)}"


def trace_href(job_id: str, trace_id: int) -> str:
    return f"{PREFIX}/trace/{trace_id}/{path_segment(job_id)}"


def _send(fetch: Any) -> Response:
    try:
        with client_for(None) as c:
            got = fetch(c)
    except ApiError as exc:
        status = exc.status if exc.status is not None and 400 <= exc.status < 500 else 502
        return Response(f"not available: {exc.detail}", status=status, mimetype="text/plain")
    headers = {"Content-Disposition": f'attachment; filename="{got.filename or "fleetprof-download"}"'}
    return Response(got.content, mimetype=got.media_type or "application/octet-stream", headers=headers)


def install_downloads(server: Any) -> None:
    @server.route(f"{PREFIX}/report/<fmt>/<path:job_id>")
    def _report(fmt: str, job_id: str) -> Response:
        if fmt not in ("json", "html"):
            return Response("format: json or html", status=404, mimetype="text/plain")
        return _send(lambda c: c.download(job_path(job_id, "report"), format=fmt, download="true"))

    @server.route(f"{PREFIX}/trace/<int:trace_id>/<path:job_id>")
    def _trace(trace_id: int, job_id: str) -> Response:
        return _send(lambda c: c.download_trace(job_id, trace_id))
