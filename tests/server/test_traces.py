"""Trace uploads: real Kineto traces (per rank, one job), snapshots converted client-side, and bad uploads."""

from __future__ import annotations

import gzip
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.server.helpers import auth

KINETO = Path(__file__).resolve().parents[1] / "data/kineto"


def _upload(api, token, job, body: bytes, **params):  # type: ignore[no-untyped-def]
    return api.post(f"/api/v1/jobs/{job}/traces", content=body, params=params,
                    headers={**auth(token), "Content-Type": "application/gzip"})


def test_eight_rank_dlrm_job_and_memory_trace_plan(api, make_token, tmp_path):
    team = make_token("team", team="recsys")
    with tarfile.open(KINETO / "param/dlrm_kineto.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    ranks = sorted(p for p in tmp_path.rglob("*.json*") if p.is_file())
    assert len(ranks) == 8
    bodies = [p.read_bytes() if p.suffix == ".gz" else gzip.compress(p.read_bytes()) for p in ranks]
    for p, body in zip(ranks, bodies):
        r = _upload(api, team, "dlrm-1", body, filename=p.name)
        assert r.status_code == 200, r.text
    again = _upload(api, team, "dlrm-1", bodies[0])  # the same bytes again: a no-op
    assert again.status_code == 200 and again.json()["created"] is False
    clash = _upload(api, team, "dlrm-1", gzip.compress(gzip.decompress(bodies[0]), mtime=1))  # rank 0 again
    assert clash.status_code == 409 and "rank 0" in clash.json()["detail"]
    report = api.get("/api/v1/jobs/dlrm-1/report", headers=auth(team)).json()
    k = report["traces"]["kineto"]
    assert k["ranks_present"] == 8 and k["world_size"] == 8 and k["missing_ranks"] == []
    b = report["time"]["breakdown"]
    assert b["idle_pct"] + b["compute_pct"] + b["non_compute_pct"] == pytest.approx(100, abs=0.01)

    mem = (KINETO / "hta/df_index_resolver/df_index_resolver.json.gz").read_bytes()
    r = _upload(api, team, "v100-mem", mem, filename="df_index_resolver.json.gz")
    assert r.status_code == 200, r.text
    report = api.get("/api/v1/jobs/v100-mem/report", headers=auth(team)).json()
    plan = report["optimization"]["offset_plan"]
    assert plan["planned_bytes"] <= 1.05 * plan["lower_bound_bytes"]
    assert report["memory"]["peak_reserved_bytes"] is not None
    assert report["sources"]["memory.peak_reserved_bytes"].startswith("kineto")
    # allocator settings computed by simulation on the trace's own events, recommended with the env line
    settings = report["optimization"]["allocator_settings"]
    assert settings["device"] == "cuda:1" and len(settings["candidates"]) >= 10
    assert settings["peak_allocated_bytes"] <= settings["best_peak_reserved_bytes"] \
        <= settings["baseline_peak_reserved_bytes"]
    [rec] = [r for r in report["recommendations"] if r["kind"] == "allocator_settings"]
    assert rec["evidence"]["env"] == f"PYTORCH_CUDA_ALLOC_CONF={settings['best_alloc_conf']}"
    assert rec["saving"]["reserved_bytes"] == settings["saving_bytes"] > 0


BAD = {
    "malformed json": (gzip.compress(b'{"traceEvents": [{"ph": "X", '), 422, "not a readable"),
    "truncated gzip": (gzip.compress(b'{"traceEvents": []}' * 1000)[:60], 422, ""),
    "not json": (gzip.compress(b"hello world"), 422, "not a JSON object"),
    "pickle": (pickle.dumps({"segments": []}), 415, "never unpickles"),
    "gzipped pickle": (gzip.compress(pickle.dumps({"segments": []})), 415, "never unpickles"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_uploads_are_4xx_and_lose_nothing(api, make_token, server_settings, case):
    team = make_token("team", team="recsys")
    good = (KINETO / "hta/nccl_parser_config/nccl_data.json.gz").read_bytes()
    assert _upload(api, team, "job-x", good).status_code == 200
    body, status, message = BAD[case]
    r = _upload(api, team, "job-x", body)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]
    report = api.get("/api/v1/jobs/job-x/report", headers=auth(team)).json()
    assert report["traces"]["kineto_files"] == 1
    leftovers = [p for p in server_settings.blob_dir.rglob("*") if p.is_file()]
    assert len(leftovers) == 1, leftovers  # the good blob only: rejected uploads leave nothing behind


def test_size_limit_and_other_team(api, make_token, server_settings):
    team, other = make_token("team", team="recsys"), make_token("team", team="vision")
    assert _upload(api, team, "job-y", gzip.compress(b'{"traceEvents": []}')).status_code in (200, 422)
    r = _upload(api, other, "job-y", gzip.compress(b'{"traceEvents": []}'))
    assert r.status_code == 404
    limit = server_settings.max_trace_upload_bytes
    r = _upload(api, team, "job-y", b"\x1f\x8b" + b"0" * (limit + 1))
    assert r.status_code == 413


def test_import_trace_cli_converts_a_snapshot_client_side(cli_env, live_server, make_token, tmp_path):
    # A snapshot dict in the structure torch.cuda.memory._snapshot() returns (no GPU here to record one).
    snap = {"segments": [{"device": 0, "address": 1 << 30, "total_size": 20 << 20, "allocated_size": 3 << 20,
                          "active_size": 3 << 20, "requested_size": (3 << 20) - 100, "stream": 0,
                          "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                          "blocks": [{"address": 1 << 30, "size": 3 << 20, "requested_size": (3 << 20) - 100,
                                      "state": "active_allocated", "frames": []},
                                     {"address": (1 << 30) + (3 << 20), "size": 17 << 20, "requested_size": 0,
                                      "state": "inactive", "frames": []}]}],
            "device_traces": [[{"action": "segment_alloc", "addr": 1 << 30, "size": 20 << 20, "stream": 0,
                                "time_us": 1, "frames": []},
                               {"action": "alloc", "addr": 1 << 30, "size": 3 << 20, "stream": 0, "time_us": 2,
                                "frames": []}]],
            "allocator_settings": {}}
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snap))
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("team", team="t")}
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "import-trace", "snap-1", str(path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "uploaded as snapshot" in r.stderr
    import httpx

    report = httpx.get(f"{live_server}/api/v1/jobs/snap-1/report", headers=auth(env["FLEETPROF_TOKEN"])).json()
    assert report["traces"]["snapshot_files"] == 1
    snapshot = report["traces"]["snapshot"]
    assert snapshot["reserved_bytes"] == 20 << 20 and snapshot["allocated_bytes"] == 3 << 20
    assert snapshot["internal_fragmentation_bytes"] == 100  # requested 3 MiB - 100 B, block 3 MiB
    assert snapshot["external_fragmentation_bytes"] == 17 << 20  # the inactive split block
    r = subprocess.run([sys.executable, "-m", "fleetprof.cli", "import-trace", "snap-1",
                        str(tmp_path / "nope.json")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot read" in r.stderr
