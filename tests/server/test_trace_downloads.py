"""Artefacts users open elsewhere (issue #22 part 4): a stored Kineto trace comes back byte for byte (Perfetto and
TensorBoard open the original `.json[.gz]`); a stored snapshot comes back as the pickle `torch.cuda.memory.
_dump_snapshot` writes, read by torch's own memory_viz functions; the report as an attachment. Team-scoped."""

from __future__ import annotations

import ast
import gzip
import hashlib
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from fleetprof.snapshot import snapshot_to_json
from tests.server.helpers import auth
from tests.traces.test_snapshot import torch_like_snapshot

KINETO = Path(__file__).resolve().parents[1] / "data/kineto"


def _upload(api, token: str, job: str, body: bytes, filename: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = api.post(f"/api/v1/jobs/{job}/traces", content=body, params={"filename": filename},
                 headers={**auth(token), "Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text
    return r.json()


def _only_trace(api, token: str, job: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = api.get(f"/api/v1/jobs/{job}/traces", headers=auth(token))
    assert r.status_code == 200, r.text
    (item,) = r.json()["traces"]
    return item


def _filename(response) -> str:  # type: ignore[no-untyped-def]
    m = re.fullmatch(r'attachment; filename="([^"]+)"', response.headers["content-disposition"])
    assert m, response.headers["content-disposition"]
    return m.group(1)


def _real_cpu_kineto_trace(tmp_path: Path) -> Path:
    """A Kineto trace torch.profiler writes on this CPU for two training steps."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            model(torch.randn(16, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    path = tmp_path / "cpu_run.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_kineto_traces_download_byte_identical(api, make_token, tmp_path):
    team = make_token("team", team="vision")
    # a real HTA trace uploaded gzip, and a trace torch writes here uploaded as plain JSON
    gz = (KINETO / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz").read_bytes()
    plain = _real_cpu_kineto_trace(tmp_path).read_bytes()
    for job, body, name, media in (("dl-gz", gz, "rank-0.pt.trace.json.gz", "application/gzip"),
                                   ("dl-plain", plain, "cpu_run.pt.trace.json", "application/json")):
        uploaded = _upload(api, team, job, body, name)
        item = _only_trace(api, team, job)
        assert item["kind"] == "kineto" and item["sha256"] == uploaded["sha256"] == hashlib.sha256(body).hexdigest()
        assert item["download_formats"] == ["original", "json"]
        r = api.get(item["download_path"], headers=auth(team))
        assert r.status_code == 200
        assert r.content == body  # byte for byte
        assert r.headers["content-type"].split(";")[0] == media
        assert _filename(r) == name
        if media == "application/gzip":
            assert gzip.decompress(r.content).lstrip().startswith(b"{")


def test_downloads_are_team_scoped_and_bad_input_is_4xx(api, make_token):
    vision = make_token("team", team="vision")
    other = make_token("team", team="nlp")
    scheduler = make_token("scheduler")
    body = (KINETO / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz").read_bytes()
    _upload(api, vision, "dl-scope", body, "t.json.gz")
    path = _only_trace(api, vision, "dl-scope")["download_path"]
    assert api.get(path, headers=auth(other)).status_code == 404  # another team's job: not found, no bytes
    assert api.get("/api/v1/jobs/dl-scope/traces", headers=auth(other)).status_code == 404
    assert api.get(path).status_code == 401
    assert api.get(path, headers=auth(scheduler)).content == body  # schedulers read every report's artefacts
    trace_id = int(path.rsplit("/", 1)[1])
    assert api.get(f"/api/v1/jobs/dl-scope/traces/{trace_id + 1000}", headers=auth(vision)).status_code == 404
    api.post("/api/v1/jobs", json={"job_id": "dl-empty", "team": "vision"}, headers=auth(vision))
    # a trace id of another job of the same team is not this job's
    assert api.get(f"/api/v1/jobs/dl-empty/traces/{trace_id}", headers=auth(vision)).status_code == 404
    assert api.get(path, params={"format": "pickle"}, headers=auth(vision)).status_code == 422  # Kineto: no pickle
    assert api.get(path, params={"format": "exe"}, headers=auth(vision)).status_code == 422
    # a format nobody offers is refused as such, before any trace is looked up
    r = api.get("/api/v1/jobs/dl-scope/traces/999999", params={"format": "exe"}, headers=auth(vision))
    assert r.status_code == 422 and "format" in r.text, r.text
    assert api.get("/api/v1/jobs/dl-scope/traces/abc", headers=auth(vision)).status_code == 422


def _bytes_per_state(flamegraph_lines: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in flamegraph_lines.splitlines():
        stack, size = line.rsplit(" ", 1)
        state = stack.split(";")[1]
        out[state] = out.get(state, 0) + int(size)
    return out


def _segsum_totals(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(segments|total_reserved|total_allocated|total_free): (.+)$", text, re.M))


@pytest.mark.parametrize("source", ["torch_like", "profiled_cpu_run"])
def test_snapshot_downloads_as_a_pickle_memory_viz_reads(api, make_token, source):
    import torch
    from torch.cuda import _memory_viz as viz

    if source == "torch_like":
        snap = torch_like_snapshot()
    else:
        from torch.cuda._memory_viz import _profile_to_snapshot

        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        opt = torch.optim.Adam(model.parameters())
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                    record_shapes=True, with_stack=True) as prof:
            for _ in range(2):
                model(torch.randn(32, 128)).sum().backward()
                opt.step()
                opt.zero_grad()
        snap = _profile_to_snapshot(prof)
    team = make_token("team", team="vision")
    doc = snapshot_to_json(pickle.dumps(snap))  # what `fleetprof import-trace` / the hooks upload
    _upload(api, team, f"dl-snap-{source}", gzip.compress(__import__("json").dumps(doc).encode()), "snap.pickle")
    item = _only_trace(api, team, f"dl-snap-{source}")
    assert item["kind"] == "snapshot" and item["download_formats"][0] == "pickle"
    r = api.get(item["download_path"], headers=auth(team))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    assert _filename(r) == "snap.pickle"
    got = pickle.loads(r.content)  # the test's own download; the server never loads a pickle

    assert set(got) >= {"segments", "device_traces"}
    # torch's own readers: the segment summary (which checks every segment's accounting), flamegraph inputs,
    # the allocation trace and the HTML viewers memory_viz serves
    summary = viz.segsum(got)
    assert _segsum_totals(summary) == _segsum_totals(viz.segsum(snap))
    # the flamegraph's bytes per block state (stack frames were dropped on conversion, the sizes were not)
    assert _bytes_per_state(viz.memory(got, format_flamegraph=lambda s: s)) == _bytes_per_state(
        viz.memory(snap, format_flamegraph=lambda s: s))
    assert viz.segments(got, format_flamegraph=lambda s: s)
    text = viz.trace(got)  # the allocator's history as torch prints it
    assert f"\n{len(snap['device_traces'][0])} entries\n" in text
    if source == "torch_like":  # (torch's own profile snapshot lacks `allocated_size`, which trace() reads)
        assert text == viz.trace(snap)
    assert len(got["device_traces"][0]) == len(snap["device_traces"][0])
    assert [(e["action"], e["size"]) for e in got["device_traces"][0]] == \
        [(e["action"], e["size"]) for e in snap["device_traces"][0]]
    assert "snapshot.pickle" in viz.trace_plot(got) and viz.segment_plot(got)

    as_json = api.get(item["download_path"], params={"format": "json"}, headers=auth(team))
    assert as_json.headers["content-type"] == "application/gzip"
    assert __import__("json").loads(gzip.decompress(as_json.content)) == doc


def test_report_downloads_as_an_attachment(api, make_token):
    team = make_token("team", team="vision")
    api.post("/api/v1/jobs", json={"job_id": "slurm:77", "team": "vision", "state": "finished"}, headers=auth(team))
    for fmt, media in (("json", "application/json"), ("html", "text/html")):
        r = api.get("/api/v1/jobs/slurm:77/report", params={"format": fmt, "download": "true"}, headers=auth(team))
        assert r.status_code == 200 and r.headers["content-type"].startswith(media)
        assert _filename(r) == f"fleetprof-slurm_77.{fmt}"
    assert "content-disposition" not in api.get("/api/v1/jobs/slurm:77/report", headers=auth(team)).headers


def test_no_server_module_loads_a_pickle(repo_root: Path) -> None:
    """Writing a pickle (the snapshot download) runs nothing; reading one would: no `pickle.load(s)`, `Unpickler`,
    or torch.load anywhere in server/."""
    found = []
    for path in (repo_root / "server").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("load", "loads", "Unpickler") and \
                    isinstance(node.value, ast.Name) and node.value.id in ("pickle", "_pickle", "torch", "dill"):
                found.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "_pickle") and \
                    any(a.name in ("load", "loads", "Unpickler") for a in node.names):
                found.append(f"{path}:{node.lineno}")
    assert found == []


@pytest.mark.slow
def test_download_cli_round_trip(cli_env, live_server, make_token, tmp_path):
    """`fleetprof import-trace` up, `fleetprof download` back: the Kineto trace byte for byte, the snapshot pickle
    that memory_viz reads, the report as two files."""
    import subprocess
    import sys

    from torch.cuda import _memory_viz as viz

    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("team", team="t")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "fleetprof.cli", *args], env=env, capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r

    kineto = KINETO / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    snap_path = tmp_path / "snapshot.pickle"
    snap = torch_like_snapshot()
    snap_path.write_bytes(pickle.dumps(snap))
    cli("import-trace", "cli-dl", str(kineto))
    cli("import-trace", "cli-dl", str(snap_path))
    listing = cli("download", "cli-dl").stdout
    assert "kineto" in listing and "snapshot" in listing and "pickle" in listing
    out = tmp_path / "out"
    (k_path,) = map(Path, cli("download", "cli-dl", "kineto", "-o", str(out)).stdout.split())
    assert k_path.parent == out and k_path.read_bytes() == kineto.read_bytes()
    (s_path,) = map(Path, cli("download", "cli-dl", "snapshot", "-o", str(out / "snap.pickle")).stdout.split())
    assert s_path == out / "snap.pickle"
    assert _segsum_totals(viz.segsum(pickle.loads(s_path.read_bytes()))) == _segsum_totals(viz.segsum(snap))
    paths = sorted(map(Path, cli("download", "cli-dl", "report", "-o", str(out)).stdout.split()))
    assert [p.name for p in paths] == ["fleetprof-cli-dl.html", "fleetprof-cli-dl.json"]
    assert __import__("json").loads(paths[1].read_text())["job_id"] == "cli-dl"
    # two ranks uploaded under one file name: both come back, neither overwrites the other
    ranks = [KINETO / "hta/trace_filter/sampled_rank-0.json.gz", KINETO / "hta/trace_filter/sampled_rank-1.json.gz"]
    for i, src in enumerate(ranks):
        (tmp_path / f"r{i}").mkdir()
        shutil.copy(src, tmp_path / f"r{i}" / "trace.json.gz")
        cli("import-trace", "cli-ranks", str(tmp_path / f"r{i}" / "trace.json.gz"))
    both = [Path(p) for p in cli("download", "cli-ranks", "kineto", "-o", str(tmp_path / "ranks")).stdout.split()]
    assert len(both) == 2 and len({p.name for p in both}) == 2
    assert sorted(p.read_bytes() for p in both) == sorted(p.read_bytes() for p in ranks)
    bad = subprocess.run([sys.executable, "-m", "fleetprof.cli", "download", "cli-dl", "999999"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no trace 999999" in bad.stderr
