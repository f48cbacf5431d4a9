"""Job ids in REST paths: `/api/v1/jobs/{job_id}/...` addresses every valid id, `/` included.

A Kubernetes job id holds a `/` (`k8s:ml/trainer-0`, fleetprof/jobid.py). In a path it travels as `%2F`
(`/api/v1/jobs/k8s:ml%2Ftrainer-0/report`, fleetprof.jobid.path_segment), but the ASGI server decodes the path
before routing, so the router would see three segments. `EncodedSlashMiddleware` routes on the raw path instead,
with every escape decoded except `%2F` and `%25`, and the `job_id` convertor decodes those within the id's one
segment. Why not `{job_id:path}`: `/jobs/k8s:ml/report` would then be both job `k8s:ml/report` and the report of
job `k8s:ml`; with `%2F` each path names exactly one thing. An id sent with a bare `/` finds no route: a 404 that
says to write `%2F` (server/jobs/router.py).

Job routes declare their id as `JOB` (`/{job_id:job_id}`); OpenAPI shows it as `{job_id}`, the REST contract's path.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetprof.jobid import path_segment

JOBS_PREFIX = "/api/v1/jobs/"
JOB = "/{job_id:job_id}"  # a job's path under the jobs router, e.g. f"{JOB}/report"
_KEPT = re.compile(r"(%2[fF5])")  # an encoded '/' or '%' stays encoded until the convertor has the id's segment


class JobIdConvertor(Convertor[str]):
    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return path_segment(value)


register_url_convertor("job_id", JobIdConvertor())


def routing_path(raw_path: str) -> str:
    """The raw path decoded except for `%2F` and `%25`."""
    parts = _KEPT.split(raw_path)
    return "".join(unquote(p) if i % 2 == 0 else p.upper() for i, p in enumerate(parts))


class EncodedSlashMiddleware:
    """Routes job paths on the raw path, `%2F` kept (plain ASGI: it runs on every request, ingest included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and b"%2" in raw and JOBS_PREFIX in scope["path"]:
            text = raw.decode("ascii", errors="replace")
            # Only where the raw path is what the server decoded (no proxy rewrote one and not the other). In place,
            # not a copy: the outer middlewares read what routing adds to this scope (the route, for its metrics).
            if unquote(text) == scope["path"]:
                scope["path"] = routing_path(text)
        await self.app(scope, receive, send)
