"""A running job is characterized again every minute from what this process read last time plus what came since
(server.jobs.running_cache: RUNNING_SERIES, SERIES_OVERLAP_S): the same arrays and the same report as reading everything,
stragglers within the overlap included; the final characterization of an ended job reads everything."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import delete, select

from tests.server.helpers import auth, sample_batch

GIB = 2**30


def _steps(job_id: str, t0: float, first: int, last: int) -> dict:
    return {"protocol_version": 1, "source_id": "hooks", "seq": first, "sent_at": time.time(), "events": [
        {"kind": "step", "job_id": job_id, "rank": rank, "step": s, "ts": t0 + 2.0 * s, "wall_s": 2.0 + 0.01 * (s % 9),
         "allocated_peak_bytes": (10 + s % 7) * GIB, "reserved_peak_bytes": 20 * GIB}
        for rank in (0, 1) for s in range(first, last)]}


def _with_processes(batch: dict) -> dict:
    """The rank processes the agent lists with each sample: one per GPU, attributed to job "inc"."""
    s = batch["samples"]
    batch["processes"] = {"ts": s["ts"], "gpu_uuid": s["gpu_uuid"], "pid": [4100 + int(u[-1]) for u in s["gpu_uuid"]],
                          "used_memory_bytes": [m - 256 * 2**20 for m in s["memory_used_bytes"]],
                          "job_id": ["inc"] * len(s["ts"]), "attribution": ["env:FLEETPROF_JOB_ID"] * len(s["ts"])}
    return batch


def _processes(data) -> list[tuple]:  # type: ignore[no-untyped-def]
    return sorted((p.gpu_uuid, p.pid, p.job_id, p.peak_used_bytes, p.first_ts, p.last_ts) for p in data.processes)


def _load(db_session, settings, *, incremental: bool, now: float):  # type: ignore[no-untyped-def]
    from server.jobs.loader import load_job_data
    from server.models import Job

    db_session.expire_all()
    job = db_session.scalar(select(Job).where(Job.job_id == "inc"))
    return load_job_data(db_session, job, settings, now=now, incremental=incremental)


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    for ga, gb in zip(a.gpus, b.gpus):
        assert np.array_equal(ga.ts, gb.ts)
        for c in gb.columns:
            assert np.array_equal(ga.columns[c], gb.columns[c], equal_nan=True), c
    for c in ("rank", "step", "ts", "wall_s", "allocated_peak_bytes"):
        assert np.array_equal(getattr(a.steps, c), getattr(b.steps, c), equal_nan=True), c
    assert _processes(a) == _processes(b) and len(a.processes) == len(b.gpus)


@pytest.fixture
def running_job(api, make_token):  # type: ignore[no-untyped-def]
    """Job "inc": running for the last ~40 minutes on 2 GPUs; the first 30 minutes of samples (every other second
    of minute 28-30 missing: they straggle in later) and of steps are in."""
    op, agent = make_token("operator"), make_token("agent", node="n")
    t0 = time.time() - 2400
    first = sample_batch(node="n", agent_id="a", seq=0, n=1800, gpus=2, t0=t0)
    s = first["samples"]
    keep = [i for i, ts in enumerate(s["ts"]) if not (t0 + 1680 <= ts < t0 + 1800 and int(ts - t0) % 2)]
    first["samples"] = {k: [v[i] for i in keep] for k, v in s.items()}
    _with_processes(first)
    assert api.post("/api/v1/ingest/samples", json=first, headers=auth(agent)).status_code == 200
    assert api.post("/api/v1/jobs", headers=auth(op), json={
        "job_id": "inc", "node": "n", "gpu_uuids": ["GPU-n-0", "GPU-n-1"], "state": "running",
        "started_at": t0}).status_code == 200
    assert api.post("/api/v1/ingest/events", json=_steps("inc", t0, 0, 900), headers=auth(op)).status_code == 200
    return {"op": op, "agent": agent, "t0": t0, "straggler": first | {"samples": {
        k: [v[i] for i in range(len(v)) if i not in set(keep)] for k, v in s.items()}}}


def test_a_running_jobs_next_read_is_what_came_since_and_equals_reading_everything(  # type: ignore[no-untyped-def]
        api, running_job, db_session, server_settings) -> None:
    from server.analysis.characterize import characterize
    from server.models import GpuSample, JobStep, ProcessSample
    from server.models.base import from_epoch

    t0, agent, op = running_job["t0"], running_job["agent"], running_job["op"]
    now = t0 + 1800
    _same(_load(db_session, server_settings, incremental=True, now=now),  # fills this process's reads
          _load(db_session, server_settings, incremental=False, now=now))
    # Then: the next 10 minutes, the stragglers of minutes 28-30 (within the overlap) and more steps.
    nxt = _with_processes(sample_batch(node="n", agent_id="a", seq=1, n=600, gpus=2, t0=t0 + 1800))
    straggler = running_job["straggler"] | {"seq": 2}
    for batch in (nxt, straggler):
        assert api.post("/api/v1/ingest/samples", json=batch, headers=auth(agent)).status_code == 200
    assert api.post("/api/v1/ingest/events", json=_steps("inc", t0, 900, 1200), headers=auth(op)).status_code == 200
    now = t0 + 2400
    incremental = _load(db_session, server_settings, incremental=True, now=now)
    everything = _load(db_session, server_settings, incremental=False, now=now)
    _same(incremental, everything)
    assert incremental.gpus[0].ts.size == 2400 and len(incremental.steps) == 2 * 1200
    assert characterize(incremental, now=now) == characterize(everything, now=now)

    # Proof that the early rows now come from the process's earlier read: gone from the database, still here.
    db_session.execute(delete(GpuSample).where(GpuSample.ts < from_epoch(t0 + 600)))
    db_session.execute(delete(JobStep).where(JobStep.ts < from_epoch(t0 + 600)))
    db_session.execute(delete(ProcessSample).where(ProcessSample.ts < from_epoch(t0 + 600)))
    db_session.commit()
    again = _load(db_session, server_settings, incremental=True, now=now)
    assert again.gpus[0].ts.size == 2400 and len(again.steps) == 2 * 1200
    assert min(p.first_ts for p in again.processes) == pytest.approx(t0, abs=1e-3)  # the earlier read's
    assert _load(db_session, server_settings, incremental=False, now=now).gpus[0].ts.size == 1800


def test_stragglers_older_than_the_overlap_wait_for_the_final_read(api, running_job, db_session,  # type: ignore[no-untyped-def]
                                                                  server_settings) -> None:
    from server.jobs.running_cache import SERIES_OVERLAP_S

    t0, agent = running_job["t0"], running_job["agent"]
    _load(db_session, server_settings, incremental=True, now=t0 + 1800 + SERIES_OVERLAP_S + 600)
    straggler = running_job["straggler"] | {"seq": 2}  # minutes 28-30: now more than the overlap back
    assert api.post("/api/v1/ingest/samples", json=straggler, headers=auth(agent)).status_code == 200
    now = t0 + 1800 + SERIES_OVERLAP_S + 660
    incremental = _load(db_session, server_settings, incremental=True, now=now)
    everything = _load(db_session, server_settings, incremental=False, now=now)
    assert everything.gpus[0].ts.size - incremental.gpus[0].ts.size == 60  # the 60 stragglers of GPU 0
