"""Trace uploads stay in their directory, nothing on the server unpickles, and tokens never reach a log."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import httpx

from tests.security.conftest import server_process
from tests.server.helpers import auth, sample_batch

KINETO = (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": 7, '
          b'"ts": 1000, "dur": 50, "args": {"device": 0, "stream": 7}}]}')
HOSTILE_NAMES = ["../../etc/passwd", "/etc/passwd", "..\\..\\windows\\win.ini", "a/../../../../tmp/owned.json",
                 "....//....//etc/passwd", "%2e%2e%2fetc%2fpasswd", "x" * 400 + "/../../y", "./.upload-x", "."]


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_trace_upload_paths_cannot_escape_the_blob_dir(api, make_token, server_settings, tmp_path):
    team = make_token("team", team="alpha")
    blob_dir = server_settings.blob_dir.resolve()
    before = _files(tmp_path)
    passwd = Path("/etc/passwd").read_bytes()
    # Hostile names in the query, and a hostile job id in the path (the blob is keyed by the job's primary key).
    for i, name in enumerate(HOSTILE_NAMES):
        job = "job-1" if i % 2 else "..%5C..%5Cescape"  # decoded: ..\..\escape
        r = api.post(f"/api/v1/jobs/{job}/traces", params={"filename": name, "rank": i}, content=KINETO % i,
                     headers=auth(team))
        assert r.status_code == 200, (name, r.text)
        stored = r.json()["filename"]
        assert "/" not in stored and stored not in (".", "..")  # metadata only, never a path
    assert Path("/etc/passwd").read_bytes() == passwd
    assert not Path("/tmp/owned.json").exists()
    new = _files(tmp_path) - before
    assert len(new) == len(HOSTILE_NAMES)
    for path in new:
        rel = path.resolve().relative_to(blob_dir)  # raises if outside
        # The server names blobs itself: <job primary key>/<sha256>.json[.gz], whatever the client said.
        assert re.fullmatch(r"\d+/[0-9a-f]{64}\.json(\.gz)?", rel.as_posix()), rel
    with api.app.state.sessionmaker() as session:
        from sqlalchemy import select

        from server.models import Trace

        keys = session.scalars(select(Trace.blob_key)).all()
    assert all(re.fullmatch(r"\d+/[0-9a-f]{64}\.json(\.gz)?", k) for k in keys)


class _Exploit:
    """Unpickling this creates a file: the proof that a server unpickled an upload."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.marker,))


def test_a_pickle_upload_is_refused_never_loaded(api, make_token, server_settings, tmp_path):
    team = make_token("team", team="alpha")
    marker = tmp_path / "unpickled"
    for protocol in (2, 4, 5):
        payload = pickle.dumps({"segments": [], "x": _Exploit(marker)}, protocol=protocol)
        r = api.post("/api/v1/jobs/job-p/traces", content=payload, headers=auth(team))
        assert r.status_code == 415 and "never unpickles" in r.json()["detail"]
        r = api.post("/api/v1/jobs/job-p/traces", content=__import__("gzip").compress(payload), headers=auth(team))
        assert r.status_code == 415
    assert not marker.exists()
    assert [p for p in server_settings.blob_dir.rglob("*") if p.is_file()] == []


UNPICKLING = re.compile(r"\b(pickle|cPickle|_pickle|dill|cloudpickle|joblib|shelve|marshal)\b\s*\.\s*(load|loads|"
                        r"Unpickler|open)\b|\btorch\s*\.\s*load\b|\bread_pickle\b|allow_pickle\s*=\s*True|"
                        r"\byaml\s*\.\s*(unsafe_load|load)\s*\(|^\s*(import|from)\s+(cPickle|_pickle|dill|"
                        r"cloudpickle|shelve|marshal)\b|^\s*from\s+pickle\s+import\b|^\s*import\s+pickle\s+as\b",
                        re.MULTILINE)
# `import pickle` itself is allowed: writing one (the snapshot download as torch's `_dump_snapshot` pickle) runs
# nothing; every way to read one (`pickle.load*`, `Unpickler`, an aliased or from-import) is caught above.


def test_the_unpickling_pattern_catches_what_it_must():
    for bad in ("pickle.loads(b)", "pickle.load(f)", "x = pickle.Unpickler(f)", "from pickle import loads",
                "import pickle as p", "import dill", "torch.load(path)", "np.load(f, allow_pickle=True)"):
        assert UNPICKLING.search(bad), bad
    for fine in ("import pickle", "pickle.dumps(doc, protocol=4)", "orjson.loads(raw)"):
        assert not UNPICKLING.search(fine), fine


def test_nothing_under_server_unpickles(repo_root):
    files = sorted((repo_root / "server").rglob("*.py"))
    assert len(files) > 30
    hits = [f"{p.relative_to(repo_root)}:{src[:m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
            for p in files for src in [p.read_text()] for m in UNPICKLING.finditer(src)]
    assert hits == [], "the server must never unpickle (PRODUCT.md):\n" + "\n".join(hits)


def test_tokens_never_reach_the_server_log(cli_env, make_token, tmp_path):
    tokens = {"operator": make_token("operator"), "agent": make_token("agent", node="node-a"),
              "team": make_token("team", team="alpha")}
    unknown = "fp_" + "Q" * 43
    log_path = tmp_path / "server.log"
    with server_process(dict(cli_env, FLEETPROF_RATE_LIMIT_BURST="5", FLEETPROF_RATE_LIMIT_PER_S="1"), log_path,
                        "--log-level", "debug") as url, httpx.Client(base_url=url, timeout=30) as c:
        op, ag, tm = (auth(tokens[k]) for k in ("operator", "agent", "team"))
        assert c.post("/api/v1/ingest/samples", json=sample_batch(node="node-a"), headers=ag).status_code == 200
        assert c.post("/api/v1/ingest/samples", json=sample_batch(node="node-b"), headers=ag).status_code == 403
        assert c.post("/api/v1/ingest/samples", content=b"{nan", headers=ag).status_code == 422
        assert c.post("/api/v1/jobs", json={"job_id": "j", "team": "beta"}, headers=tm).status_code == 403
        assert c.get("/api/v1/jobs/nope", headers=tm).status_code == 404
        assert c.get("/api/v1/nodes", headers=auth(unknown)).status_code == 401
        assert c.get("/api/v1/nodes", headers={"Authorization": tokens["team"]}).status_code == 401  # no "Bearer"
        assert c.get("/api/v1/jobs", params={"token": tokens["team"]}).status_code == 401  # token in a URL
        assert 429 in [c.get("/api/v1/nodes", headers=op).status_code for _ in range(8)]
        assert c.get("/metrics").status_code == 200
    log = log_path.read_text()
    assert "GET" in log or "uvicorn" in log.lower() or "Started" in log, log[:500]  # the log was written
    for secret in (*tokens.values(), unknown):
        assert secret not in log and secret[3:25] not in log, "a token reached the server log"
