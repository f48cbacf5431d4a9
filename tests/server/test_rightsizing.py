"""Right-sizing over the runs of one recurring job, answered from cached reports."""

from __future__ import annotations

import time

from tests.server.helpers import auth, sample_batch


def _run(api, op, agent, job_id: str, seq0: int, t0: float, mem_gib: float, name: str = "bert-finetune"):  # type: ignore[no-untyped-def]
    api.post("/api/v1/jobs", json={"job_id": job_id, "name": name, "team": "nlp", "node": "node-a",
                                   "gpu_uuids": ["GPU-node-a-0"], "started_at": t0, "state": "running",
                                   "batch_size": 32}, headers=auth(op))
    batch = sample_batch(seq=seq0, n=120, gpus=1, t0=t0)
    batch["samples"]["memory_used_bytes"] = [int(mem_gib * 2**30)] * 120
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    api.post("/api/v1/jobs", json={"job_id": job_id, "state": "finished", "ended_at": t0 + 119, "exit_code": 0},
             headers=auth(op))
    api.get(f"/api/v1/jobs/{job_id}/report", headers=auth(op))


def test_recurring_job_history_drives_the_recommendation(api, make_token):
    op, agent = make_token("operator"), make_token("agent", node="node-a")
    sched, other_team = make_token("scheduler"), make_token("team", team="vision")
    t0 = time.time() - 86400
    for i, gib in enumerate((10.0, 12.0, 11.0)):
        _run(api, op, agent, f"bert-{i}", i, t0 + 3600 * i, gib)
    _run(api, op, agent, "other-0", 10, t0 + 20000, 70.0, name="something else")
    r = api.get("/api/v1/jobs/bert-2/rightsizing", headers=auth(sched))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["history_job_ids"] == ["bert-0", "bert-1", "bert-2"] and body["runs"] == 3
    mem = body["memory"]
    assert mem["observed_peak_bytes"] == 12 * 2**30  # the largest peak over the runs, not the other job's 70 GiB
    assert mem["target_bytes"] >= mem["observed_peak_bytes"]
    kinds = {rec["kind"] for rec in body["recommendations"]}
    assert kinds and all(rec["reason"] for rec in body["recommendations"])
    # telemetry without hooks has no step time: no projection onto other GPUs, and the answer says why
    assert body["projections"] == [] and body["projection_unavailable"]
    assert api.get("/api/v1/jobs/bert-2/rightsizing", headers=auth(other_team)).status_code == 404
    assert api.get("/api/v1/jobs/nope/rightsizing", headers=auth(sched)).status_code == 404


def test_next_run_of_a_recurring_job_is_sized_by_its_name(api, make_token):
    """A scheduler about to launch the next run has no job id yet: it asks by name, and gets the answer the
    latest run's id would give; a team sees only its own team's runs."""
    op, agent = make_token("operator"), make_token("agent", node="node-a")
    sched, nlp, vision = make_token("scheduler"), make_token("team", team="nlp"), make_token("team", team="vision")
    t0 = time.time() - 86400
    for i, gib in enumerate((10.0, 12.0, 11.0)):
        _run(api, op, agent, f"bert-{i}", i, t0 + 3600 * i, gib)
    by_id = api.get("/api/v1/jobs/bert-2/rightsizing", headers=auth(sched)).json()
    for token, params in ((sched, {"name": "bert-finetune"}), (sched, {"name": "bert-finetune", "team": "nlp"}),
                          (nlp, {"name": "bert-finetune"})):
        r = api.get("/api/v1/rightsizing", params=params, headers=auth(token))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["job_id"] == "bert-2" and body["team"] == "nlp"  # the latest run
        assert body["history_job_ids"] == by_id["history_job_ids"] == ["bert-0", "bert-1", "bert-2"]
        assert body["memory"] == by_id["memory"] and body["recommendations"] == by_id["recommendations"]
    for token, params in ((vision, {"name": "bert-finetune"}), (vision, {"name": "bert-finetune", "team": "nlp"}),
                          (sched, {"name": "bert-finetune", "team": "vision"}), (sched, {"name": "never-ran"})):
        r = api.get("/api/v1/rightsizing", params=params, headers=auth(token))
        assert r.status_code == 404 and "no runs of" in r.json()["detail"], (params, r.text)
    assert api.get("/api/v1/rightsizing", headers=auth(sched)).status_code == 422  # the name is required
    assert api.get("/api/v1/rightsizing", params={"name": "bert-finetune"},
                   headers=auth(agent)).status_code == 403


def test_history_inputs_come_from_the_cache_and_never_go_stale(api, make_token, db_session):
    from sqlalchemy import event

    from server.jobs.history import rightsizing_history
    from server.jobs.service import find_job
    from server.lru import LruCache

    op, agent = make_token("operator"), make_token("agent", node="node-a")
    t0 = time.time() - 86400
    for i, gib in enumerate((10.0, 12.0)):
        _run(api, op, agent, f"bert-{i}", i, t0 + 3600 * i, gib)
    cache: LruCache = LruCache(max_entries=100)
    job = find_job(db_session, "bert-1")
    runs = rightsizing_history(db_session, job, limit=50, cache=cache)
    assert [(j, r["peak_used_bytes"]) for j, r in runs] == [("bert-0", 10 * 2**30), ("bert-1", 12 * 2**30)]
    statements: list[str] = []

    def listen(conn, cursor, statement, *_):  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(db_session.get_bind(), "before_cursor_execute", listen)
    try:
        assert rightsizing_history(db_session, job, limit=50, cache=cache) == runs
        assert len(statements) == 1 and "reports.data" not in statements[0]  # no report document read
    finally:
        event.remove(db_session.get_bind(), "before_cursor_execute", listen)
    # bert-0 gets later samples and its report is recomputed: the cache cannot answer with the old one.
    batch = sample_batch(seq=50, n=10, gpus=1, t0=t0 + 60.5)
    batch["samples"]["memory_used_bytes"] = [20 * 2**30] * 10
    assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    assert api.get("/api/v1/jobs/bert-0/report", params={"refresh": True}, headers=auth(op)).status_code == 200
    runs = rightsizing_history(db_session, job, limit=50, cache=cache)
    assert [(j, r["peak_used_bytes"]) for j, r in runs] == [("bert-0", 20 * 2**30), ("bert-1", 12 * 2**30)]


def test_a_report_recomputed_between_the_two_reads_keeps_its_run(api, make_token, db_session):
    """A worker characterizing a just-finished run upserts its report (a new computed_at) between the history's
    list of reports and its read of their inputs: the run is answered with the newer report, not dropped."""
    import datetime as dt

    from sqlalchemy import event, select, update

    from server.jobs.history import rightsizing_history
    from server.jobs.service import find_job
    from server.lru import LruCache
    from server.models import Report

    op, agent = make_token("operator"), make_token("agent", node="node-a")
    t0 = time.time() - 86400
    for i, gib in enumerate((10.0, 12.0)):
        _run(api, op, agent, f"bert-{i}", i, t0 + 3600 * i, gib)
    job = find_job(db_session, "bert-1")
    engine = db_session.get_bind().engine

    def recompute_first(conn, cursor, statement, *_):  # type: ignore[no-untyped-def]
        if "reports.data" in statement:
            with engine.begin() as other:  # another connection, committed before the read runs
                stored = other.execute(select(Report.computed_at).where(Report.job_pk == job.id)).scalar_one()
                other.execute(update(Report).where(Report.job_pk == job.id)
                              .values(computed_at=stored + dt.timedelta(seconds=1)))

    event.listen(db_session.get_bind(), "before_cursor_execute", recompute_first)
    try:
        runs = rightsizing_history(db_session, job, limit=50, cache=LruCache(max_entries=100))
    finally:
        event.remove(db_session.get_bind(), "before_cursor_execute", recompute_first)
    assert [(j, r["peak_used_bytes"]) for j, r in runs] == [("bert-0", 10 * 2**30), ("bert-1", 12 * 2**30)]


def test_rightsizing_cli_by_job_and_by_name(api, make_token, cli_env, live_server):
    import json
    import subprocess
    import sys

    op, agent = make_token("operator"), make_token("agent", node="node-a")
    t0 = time.time() - 86400
    for i, gib in enumerate((10.0, 12.0, 11.0)):
        _run(api, op, agent, f"bert-{i}", i, t0 + 3600 * i, gib)
    env = {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("scheduler")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleetprof.cli", "rightsizing", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    table = cli("--name", "bert-finetune", "--team", "nlp")
    assert table.returncode == 0, table.stderr
    assert "3 run(s): bert-0, bert-1, bert-2" in table.stdout
    assert any(line.split()[:1] == ["observed_peak_bytes"] and "12.00 GiB" in line
               for line in table.stdout.splitlines()), table.stdout
    assert "[recommendations]" in table.stdout and "why: " in table.stdout
    as_json = cli("bert-2", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == api.get("/api/v1/jobs/bert-2/rightsizing", headers=auth(op)).json()
    for bad, message, code in ((("bert-2", "--name", "x"), "one of the two", 2), ((), "one of the two", 2),
                               (("bert-2", "--team", "nlp"), "--team goes with --name", 2),
                               (("--name", "nope"), "404", 3)):  # usage 2, not found 3 (fleetprof.errors)
        r = cli(*bad)
        assert r.returncode == code and message in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)
