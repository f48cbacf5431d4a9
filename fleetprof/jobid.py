"""The job-id grammar: the one definition that the wire protocol, the REST API, the CLI and the dashboard share.

A job id is 1 to 200 characters, in one or more segments joined by single `/`. A segment is made of ASCII letters,
digits and `. _ : @ + = -`, and is not made of dots only. Why each rule:

- the characters are those of every id the product makes: `fleetprof run` (`alice-20260714-081238-3f9a`), Slurm
  (`slurm:123`, array tasks `slurm:123_4`, heterogeneous components `slurm:123+0`), Kubernetes
  (`k8s:<namespace>/<pod>`: DNS-1123 names, lowercase letters, digits, `-` and `.`; a pod by its cgroup UID
  `k8s:pod-<uid>`), and the ids people choose (`user@cluster`, `run=3`); they need no quoting in a shell, a
  header or a log line;
- `/` is allowed because Kubernetes names a pod inside its namespace; a REST path carries it as `%2F`
  (`path_segment`), and the API reads that back as one id (server/job_paths.py);
- no whitespace, no control characters, nothing outside ASCII: an id is printed in tables, logs and file names,
  and two ids that look the same must be the same;
- no empty segment (`//`, a leading or trailing `/`) and no segment of dots only (`.`, `..`): browsers, proxies
  and HTTP clients rewrite those in a path, so such an id could not be addressed, or would address another;
- no `,` (`GET /api/v1/jobs/compare?ids=a,b` separates ids with it), `%`, `?`, `#` (they mean something in a URL);
- at most 200 characters: the length of the `job_id` columns. Kubernetes allows a 63-character namespace and a
  253-character pod name; an id of such a pod that would be longer is shortened by `k8s_job_id` (the pod name cut
  and a hash of it appended after `_`, which no Kubernetes name contains, so it cannot equal another pod's id).
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

MAX_LENGTH = 200  # jobs.job_id and process_samples.job_id are varchar(200)
_CHAR = "A-Za-z0-9._:@+=-"
_SEGMENT = rf"\.*[A-Za-z0-9_:@+=-][{_CHAR}]*"  # at least one character that is not a dot
# Anchored both ends; also valid as a pydantic (Rust regex) pattern, which is how the wire protocol uses it.
PATTERN = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"
_RE = re.compile(PATTERN)
_BAD_CHAR = re.compile(rf"[^/{_CHAR}]")
_HASH_CHARS = 12


def job_id_problem(value: str) -> str | None:
    """What makes `value` not a job id, in a few words; None when it is one."""
    if not value:
        return "a job id cannot be empty"
    if len(value) > MAX_LENGTH:
        return f"a job id has at most {MAX_LENGTH} characters, this one {len(value)}"
    if _RE.fullmatch(value):
        return None
    bad = _BAD_CHAR.search(value)
    if bad:
        return (f"{bad.group()!r} is not allowed in a job id (letters, digits, '/' and . _ : @ + = - are; no "
                "whitespace)")
    return "a job id has no empty part and no part of dots only between '/' (no leading, trailing or double '/')"


def is_job_id(value: str) -> bool:
    return len(value) <= MAX_LENGTH and _RE.fullmatch(value) is not None


def check_job_id(value: str) -> str:
    """`value` if it is a job id, else ValueError saying why (the wire protocol's validator)."""
    problem = job_id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def path_segment(job_id: str) -> str:
    """The id as one segment of a URL path: `/` as `%2F` (so `k8s:ml/trainer-0` reads `k8s:ml%2Ftrainer-0`);
    `:`, `@`, `+` and `=` stay readable, as RFC 3986 allows in a path segment."""
    return quote(job_id, safe=":@+=")


def report_filename(job_id: str, extension: str) -> str:
    """`fleetprof-<job id>.<extension>`, the id's characters a file name cannot hold (`slurm:42`, `k8s:ml/x`) as `_`:
    the report's name in local mode (`fleetprof.profile()`) and in the API's `?download=true` attachment."""
    return "fleetprof-" + re.sub(r"[^A-Za-z0-9._-]", "_", job_id) + f".{extension}"


def job_path(job_id: str, *rest: str) -> str:
    """The REST path of a job or one of its resources: `job_path(id, "report")` -> `/api/v1/jobs/<id>/report`."""
    return "/".join(("/api/v1/jobs", path_segment(job_id), *rest))


def k8s_job_id(namespace: str, pod: str) -> str:
    """`k8s:<namespace>/<pod>`; a pod name too long for that is cut, and 12 hex digits of its SHA-256 follow `_`."""
    job_id = f"k8s:{namespace}/{pod}"
    if len(job_id) <= MAX_LENGTH:
        return job_id
    digest = hashlib.sha256(pod.encode()).hexdigest()[:_HASH_CHARS]
    keep = MAX_LENGTH - len(f"k8s:{namespace}/") - 1 - _HASH_CHARS
    return f"k8s:{namespace}/{pod[:keep]}_{digest}"
