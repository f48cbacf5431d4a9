"""Acceptance (issue 3): an agent playing a recording while the collector is stopped for 60 s and started again
delivers everything, exactly once, and the job report afterwards equals the report of the same recording
replayed directly with `fleetprof replay`.

Real processes: `fleetprof server` (stopped and restarted on the same port), `fleetprof agent --source
replay-original:FILE` (the recording's own timestamps, one sample per recorded row), `fleetprof replay`.
Counts are taken in Postgres. The recording is built from the real H100 nvidia-smi capture
(`conftest.build_h100_recording`: its idle and loaded rows repeated 1 s apart for 2 GPUs x 150 timesteps).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from fleetprof.recordings import read_recording
from tests.e2e.conftest import FLEETPROF, client_env, stop_process

OUTAGE_S = 60.0
INTERVAL_S = 0.5  # 150 timesteps -> 75 s of playback: before, during and after the outage
AGENT_NODE = "e2e-agent-node"
DIRECT_NODE = "e2e-direct-node"
VALUE_COLUMNS = ("memory_used_bytes", "memory_total_bytes", "gpu_util_pct", "mem_util_pct", "power_w",
                 "temperature_c", "sm_clock_mhz", "mem_clock_mhz", "throttle_reasons")


def _stored(engine, node: str) -> list[tuple]:
    cols = ", ".join(f"s.{c}" for c in VALUE_COLUMNS)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            f"SELECT g.uuid, extract(epoch from s.ts)::float8, {cols} FROM gpu_samples s "
            "JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.name = :node "
            "ORDER BY g.uuid COLLATE \"C\", s.ts"), {"node": node})]


def _count(engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


def _sample_count(engine, node: str) -> int:
    return _count(engine, "SELECT count(*) FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
                          "JOIN nodes n ON n.id = g.node_id WHERE n.name = :node", node=node)


def _process_count(engine, node: str) -> int:
    return _count(engine, "SELECT count(*) FROM process_samples p JOIN gpus g ON g.id = p.gpu_id "
                          "JOIN nodes n ON n.id = g.node_id WHERE n.name = :node", node=node)


def _wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _assert_same_figures(got: object, want: object, path: str = "report") -> None:
    """Equal, numbers up to float rounding (sums taken in another order)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            _assert_same_figures(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same_figures(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), f"{path}: {got!r} != {want!r}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


@pytest.mark.slow
def test_agent_survives_60s_collector_outage_exactly_once(restartable_server, h100_recording: Path, cli_env,
                                                          make_token, pg_engine, tmp_path: Path) -> None:
    server = restartable_server
    rec = read_recording(h100_recording)
    uuids = [g.uuid for g in rec.gpus]
    n_rows, n_procs = len(rec.rows), len(rec.processes)
    assert len(uuids) == 2 and n_rows == 300 and n_procs > 0
    operator = make_token("operator")
    agent_token = make_token("agent", node=AGENT_NODE)
    api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {operator}"}, timeout=30)

    # the job, bound to the recording's GPUs on the agent's node, as `fleetprof replay` registers its own
    job_a, job_b = "e2e-outage-agent", "e2e-outage-direct"
    api.post("/api/v1/jobs", json={"job_id": job_a, "node": AGENT_NODE, "state": "running",
                                   "started_at": rec.start_ts, "gpu_uuids": uuids}).raise_for_status()

    agent_log = open(tmp_path / "agent.log", "w")
    agent = subprocess.Popen(
        [*FLEETPROF, "agent", "--source", f"replay-original:{h100_recording}", "--spool", str(tmp_path / "spool"),
         "--node", AGENT_NODE, "--interval", str(INTERVAL_S)],
        env=client_env(cli_env, server.url, agent_token, FLEETPROF_BATCH_INTERVAL_S="2",
                       # the default 60 s backoff ceiling would only make the test wait longer after the restart
                       FLEETPROF_SHIP_BACKOFF_MAX_S="8"),
        stdout=agent_log, stderr=subprocess.STDOUT)
    try:
        # delivery works before the outage
        _wait_until(lambda: _sample_count(pg_engine, AGENT_NODE) > 0, 30, "the agent's first batch")
        t_down = time.monotonic()
        server.stop()
        before = _sample_count(pg_engine, AGENT_NODE)
        assert 0 < before < n_rows

        # the collector is down for 60 s; the agent keeps sampling (into its spool) and never gives up
        while time.monotonic() - t_down < OUTAGE_S:
            time.sleep(5)
            assert agent.poll() is None, "the agent died while the collector was down"
        assert _sample_count(pg_engine, AGENT_NODE) == before  # nothing could arrive meanwhile
        spooled = sorted((tmp_path / "spool").glob("*.jsonl"))
        assert spooled and sum(p.stat().st_size for p in spooled) > 0

        server.start()
        _wait_until(lambda: _sample_count(pg_engine, AGENT_NODE) >= n_rows, 90, "every sample after the restart")
        _wait_until(lambda: "end of the recording" in (tmp_path / "agent.log").read_text(), 30,
                    "the agent to reach the end of the recording")
        time.sleep(INTERVAL_S * 4 + 2)  # one more batch cut and ship: nothing more may arrive
        assert agent.poll() is None, "the agent exited on its own"
    finally:
        rc = stop_process(agent)
        agent_log.close()
    log = (tmp_path / "agent.log").read_text()
    assert rc == 0, log
    assert "collector unavailable" in log  # the outage was seen by the shipper, and ridden out
    assert "stay spooled" not in log, log  # everything was acknowledged before the agent stopped

    # exactly once: every recorded row is stored, none twice, values verbatim, timestamps the recording's own
    stored = _stored(pg_engine, AGENT_NODE)
    assert len(stored) == n_rows
    assert len({(u, round(ts, 3)) for u, ts, *_ in stored}) == n_rows
    want = sorted((r.gpu_uuid, r.ts, *(r.values.get(c) for c in VALUE_COLUMNS)) for r in rec.rows)
    for got_row, want_row in zip(stored, want):
        assert got_row[0] == want_row[0] and got_row[1] == pytest.approx(want_row[1], abs=1e-3)
        assert got_row[2:] == pytest.approx(want_row[2:]), (got_row, want_row)
    # ... and accepted once: the batches the collector acknowledged as new hold exactly the recording's rows
    # (a batch resent after a lost acknowledgement is a duplicate and adds nothing)
    assert _count(pg_engine, "SELECT coalesce(sum(rows), 0) FROM ingest_batches WHERE kind = 'samples' "
                             "AND source_id LIKE :a", a=f"{AGENT_NODE}-%") == n_rows
    assert _process_count(pg_engine, AGENT_NODE) == n_procs

    api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {operator}"}, timeout=60)
    api.post("/api/v1/jobs", json={"job_id": job_a, "state": "finished", "ended_at": rec.end_ts,
                                   "exit_code": 0}).raise_for_status()

    # the same recording replayed directly into another job, on another node (GPU UUIDs are per node)
    direct = subprocess.run(
        [*FLEETPROF, "replay", str(h100_recording), "--job-id", job_b, "--node", DIRECT_NODE],
        env=client_env(cli_env, server.url, operator), capture_output=True, text=True, timeout=120)
    assert direct.returncode == 0, direct.stderr
    assert _sample_count(pg_engine, DIRECT_NODE) == n_rows
    assert [r[2:] for r in _stored(pg_engine, DIRECT_NODE)] == [r[2:] for r in stored]

    report_a = api.get(f"/api/v1/jobs/{job_a}/report").raise_for_status().json()
    report_b = api.get(f"/api/v1/jobs/{job_b}/report").raise_for_status().json()
    assert report_a["state"] == report_b["state"] == "finished"
    assert report_a["duration_s"] == pytest.approx(report_b["duration_s"])
    assert report_a["duration_s"] == pytest.approx(rec.end_ts - rec.start_ts, abs=1e-3)
    # the figures are real, not nulls compared with nulls
    assert report_a["memory"]["peak_used_bytes"] == max(r.values["memory_used_bytes"] for r in rec.rows)
    assert report_a["energy"]["energy_j"] > 0 and report_a["utilization"]["gpu_mean_pct"] > 0
    # Process attribution differs, and should: the agent replaying original rows attributes nothing (the
    # recording's pids are not this host's), `fleetprof replay --job-id` gives unattributed rows to its job.
    # The processes and their peaks are the same.
    procs = {}
    for report, job_id in ((report_a, None), (report_b, job_b)):
        mem = report["memory"]
        rows = mem.pop("processes")
        assert rows and all(p["job_id"] == job_id for p in rows)
        procs[job_id] = sorted((p["gpu_uuid"], p["pid"], p["peak_used_bytes"]) for p in rows)
        for key in ("process_peak_bytes", "job_processes", "other_processes", "other_processes_peak_bytes"):
            mem.pop(key)
    assert procs[None] == procs[job_b]
    for section in ("memory", "energy", "utilization", "time"):
        _assert_same_figures(report_a[section], report_b[section], section)
    _assert_same_figures(report_a["gpus"], report_b["gpus"], "gpus")
