"""GET /api/v1/jobs/{job_id}/rightsizing answered from cache: a recurring job with a realistic history, a real
`fleetprof server` process (uvicorn) on Postgres on this machine, sequential keep-alive requests from one client.

History: --runs earlier runs of one job name (and the run asked about), each with the cached report the worker
stores: real `characterize()` output of a synthetic --hours x --gpus job at 1 Hz with hook steps (bench/characterize.py),
batch sizes and memory varying between runs so that every right-sizing rule has data. Beside them, --other-jobs
runs of 500 other names in the same team, with reports, so that the history query has a team's worth of rows to
skip. Raw samples are not written: an answer from cache never reads them. Target: p99 <= 20 ms.

    .venv/bin/python bench/rightsizing.py [--runs 50] [--requests 1000] [--hours 2] [--gpus 8] [--other-jobs 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.characterize import synthetic_job  # noqa: E402
from bench.report import write_report  # noqa: E402
from bench.scratch import fleetprof_server, scratch_database  # noqa: E402
from server.analysis.characterize import ANALYZER_VERSION, characterize  # noqa: E402
from server.auth.service import create_token  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from server.migrate import upgrade  # noqa: E402
from server.models import Gpu, Job, JobGpu, Node, Report  # noqa: E402
from server.models.base import from_epoch  # noqa: E402

GIB = 2**30
NAME, TEAM = "llama-finetune", "nlp"
BATCHES = (16, 32, 48, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def history_reports(runs: int, hours: float, gpus: int) -> list[dict]:
    """`runs` real reports of one recurring job: batch size and memory vary, one run ended out of memory."""
    out = []
    for i in range(runs):
        job = synthetic_job(hours=hours, n_gpus=gpus, seed=i)
        batch = BATCHES[i % len(BATCHES)]
        job.job_id, job.name, job.team, job.batch_size = f"{NAME}-{i:03d}", NAME, TEAM, batch
        for g in job.gpus:  # activations grow with the batch: ~0.4 GiB per sample on top of 40 GiB
            for col in ("memory_used_bytes", "memory_used_max_bytes"):
                g.columns[col] = g.columns[col] - 60 * GIB + (40 + 0.4 * batch) * GIB
        if i == runs // 2:
            job.state, job.exit_code, job.oom_events = "oom", 1, 1
        shift = (i - runs) * 86_400.0  # one run a day, the last one yesterday
        job.started_at = (job.started_at or 0.0) + shift + time.time() - 1_700_000_000.0
        job.ended_at = job.started_at + hours * 3600
        for g in job.gpus:
            g.ts = g.ts + (job.started_at - g.ts[0])
        out.append(characterize(job, now=job.ended_at + 600))
    return out


OTHER_GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S")


def seed(factory, reports: list[dict], other_jobs: int, gpus: int) -> None:  # type: ignore[no-untyped-def]
    """The recurring job's runs (one a day, with their GPUs) and `other_jobs` runs of 500 other names in the
    same team over the same months, each with a report (a small one: only the history query's selectivity
    matters for them, the answer never reads their documents) and a fingerprint per name: the fleet's runs of
    other models that calibrate the projections onto other GPU types (`_other_inputs`)."""
    now = time.time()
    with session_scope(factory) as session:
        node = Node(name="bench-node", dropped_samples_total=0)
        session.add(node)
        session.flush()
        gpu_rows = [Gpu(node_id=node.id, uuid=f"GPU-{i}", index=i, name="NVIDIA H100 80GB HBM3", healthy=True,
                        memory_total_bytes=85520809984) for i in range(gpus)]
        session.add_all(gpu_rows)
        session.flush()
        for k, report in enumerate(reports):
            started = from_epoch(now - 86_400.0 * (len(reports) - k))
            assert started is not None
            ended = from_epoch(started.timestamp() + (report.get("duration_s") or 3600))
            assert ended is not None
            job = Job(job_id=report["job_id"], name=NAME, team=TEAM, state=report["state"], started_at=started,
                      ended_at=ended, batch_size=report.get("batch_size"), framework="pytorch", extra={})
            session.add(job)
            session.flush()
            session.add_all([JobGpu(job_pk=job.id, gpu_id=g.id, source="registered") for g in gpu_rows])
            session.add(Report(job_pk=job.id, analyzer_version=ANALYZER_VERSION,
                               computed_at=from_epoch(ended.timestamp() + 600), data=report))
    with session_scope(factory) as session:
        span = 86_400.0 * len(reports)
        session.execute(Job.__table__.insert(), [
            {"job_id": f"other-{k:06d}", "name": f"other-model-{k % 500}", "team": TEAM, "state": "finished",
             "started_at": from_epoch(now - span * (k + 1) / other_jobs), "ended_at": from_epoch(now - span * k / other_jobs),
             "created_at": from_epoch(now), "updated_at": from_epoch(now), "extra": {},
             "fingerprint": f"{k % 500:020x}"} for k in range(other_jobs)])
        pks = session.execute(select(Job.id, Job.job_id).where(Job.job_id.like("other-%"))).all()
        session.execute(Report.__table__.insert(), [
            {"job_pk": pk, "analyzer_version": ANALYZER_VERSION, "computed_at": from_epoch(now),
             "data": {"job_id": job_id, "rightsizing_inputs": _other_inputs(job_id)}} for pk, job_id in pks])


def _other_inputs(job_id: str) -> dict[str, object]:
    """A run of another model: on one of three GPU types in turn (so that every model has runs on each, the
    projections' other-models' pairs), 8 GPUs like the recurring job."""
    k = int(job_id.rsplit("-", 1)[1])
    return {"job_id": job_id, "peak_used_bytes": 10 * GIB, "gpu_name": OTHER_GPUS[k % len(OTHER_GPUS)],
            "gpu_count": 8, "batch_size": 32, "precision": "torch.bfloat16", "step_time_s": 0.2 + (k % 7) * 0.05,
            "energy_per_step_j": 800.0 + (k % 5) * 40.0, "gpu_util_mean_pct": 85.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="earlier runs of the job name")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--hours", type=float, default=2.0, help="length of each run (report size)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--other-jobs", type=int, default=20_000, help="runs of other names in the same team")
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    args = parser.parse_args()
    with scratch_database("fleetprof_bench_rs") as url, ExitStack() as stack:
        settings = ServerSettings(database_url=url)
        upgrade(settings)
        engine = make_engine(settings)
        factory = make_sessionmaker(engine)
        t = time.perf_counter()
        reports = history_reports(args.runs + 1, args.hours, args.gpus)
        characterize_s = time.perf_counter() - t
        seed(factory, reports, args.other_jobs, args.gpus)
        with session_scope(factory) as session:
            token = create_token(session, scope="scheduler")
        engine.dispose()
        report_bytes = statistics.median(len(json.dumps(r)) for r in reports)

        workdir = Path(tempfile.mkdtemp(prefix="fleetprof-bench-rs-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
        # The per-token rate limiter stays on (its cost is part of a request), with room for the whole run.
        env.update(FLEETPROF_DATABASE_URL=url, FLEETPROF_DATA_DIR=str(workdir), FLEETPROF_ENVIRONMENT="production",
                   FLEETPROF_RATE_LIMIT_BURST=str(10 * (args.requests + args.warmup)))
        port = args.port or free_port()
        base, _ = stack.enter_context(fleetprof_server(env, port, ROOT))

        current = reports[-1]["job_id"]
        path = f"/api/v1/jobs/{current}/rightsizing"
        load_before = os.getloadavg()
        lat = []
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            for i in range(args.warmup + args.requests):
                t = time.perf_counter()
                r = http.get(path)
                dt = time.perf_counter() - t
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
                if i >= args.warmup:
                    lat.append(dt)
            body = r.json()
        load_after = os.getloadavg()
        ms = np.array(lat) * 1000
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        rows = [
            ("history runs used / kinds", f"{body['runs']} / {sorted({x['kind'] for x in body['recommendations']})}"),
            ("report JSON per run (median)", f"{report_bytes / 1024:.0f} KiB  ({args.hours:g} h x {args.gpus} GPUs)"),
            ("jobs in the database", f"{len(reports) + args.other_jobs}"),
            ("characterize the history", f"{characterize_s:.1f} s"),
            ("requests (after warm-up)", f"{len(lat)}  sequential, keep-alive"),
            ("latency p50 / p90 / p99 / max",
             f"{p50:.1f} / {p90:.1f} / {p99:.1f} / {ms.max():.1f} ms   (target p99 <= 20 ms)"),
            ("throughput", f"{len(lat) / sum(lat):.0f} requests/s"),
            ("load average before / after (1 min)",
             f"{load_before[0]:.2f} / {load_after[0]:.2f}  ({os.cpu_count()} CPUs)"),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
        print(f"{'verdict':<{width}}  {'target met' if p99 <= 20.0 else 'TARGET MISSED'}")
        write_report(__file__, {
            "history_runs_count": body["runs"], "report_json_median_bytes": report_bytes,
            "jobs_count": len(reports) + args.other_jobs, "characterize_history_s": characterize_s,
            "requests_count": len(lat), "latency_p50_ms": p50, "latency_p90_ms": p90, "latency_p99_ms": p99,
            "latency_max_ms": ms.max(), "throughput_requests_per_s": len(lat) / sum(lat),
            "load_average_1min_before_ratio": load_before[0], "load_average_1min_after_ratio": load_after[0],
            "target_p99_met_ok": bool(p99 <= 20.0)})
        return 0

if __name__ == "__main__":
    sys.exit(main())
