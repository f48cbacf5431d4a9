"""Benchmark: time in headless Chromium until the fleet page and a job page are fully drawn.

Run: .venv/bin/python bench/dashboard.py [--gpus 1000] [--hours 24] [--job-gpus 8] [--repeat 3]

What it loads into a fresh Postgres database (dropped at the end), through the real ingest API where the data
is raw telemetry:
- fleet: `--gpus` GPUs on nodes of 8, registered by ingesting `--fleet-raw-s` seconds of 1 Hz raw samples each
  (the last minutes: "idle now" and inventory), plus `--hours` hourly rollups per GPU written straight into
  `gpu_hourly` (1,000 GPUs x 24 h of raw samples would be 86 M rows: too heavy for this machine) and
  `--jobs` finished jobs with reports (headroom distribution, wasteful jobs);
- job page: one job of `--job-gpus` GPUs x `--hours` h at 1 Hz of raw samples (691,200 for 8 x 24 h), ingested
  through POST /api/v1/ingest/samples and characterized by the server.
"Fully drawn" = every plot has its data drawn, the KPI values are on the page and no Dash callback is pending.
Screenshots go to docs/screenshots/{fleet,job}.png. Synthetic data: only timing and rendering are measured.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
GIB = 2**30
H100_BYTES = 81559 * 2**20

DRAWN_JS = """
const graphs = [...document.querySelectorAll('.js-plotly-plot')];
if (graphs.length < arguments[0]) return false;
if (document.querySelector('[data-dash-is-loading="true"]')) return false;
for (const g of graphs) { if (!g._fullLayout || !g.data) return false; }
for (const sel of arguments[1]) { const el = document.querySelector(sel); if (!el || !el.textContent.trim()) return false; }
return graphs.every(g => g.data.length > 0 || (g._fullLayout.annotations || []).length > 0);
"""


def _post(http: httpx.Client, path: str, payload: object) -> None:
    if path.startswith("/api/v1/ingest/"):  # telemetry travels gzip-compressed, as the agent sends it
        r = http.post(path, content=gzip.compress(json.dumps(payload).encode()),
                      headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    else:
        r = http.post(path, json=payload)
    if r.status_code >= 300:
        raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")


def _batch(node: str, seq: int, uuids: list[str], ts: np.ndarray, util: np.ndarray, mem: np.ndarray,
           power: np.ndarray) -> dict:
    n = len(ts)
    g = len(uuids)
    return {
        "protocol_version": 1, "node": node, "agent_id": f"bench-{node}", "seq": seq, "sent_at": time.time(),
        "source": "test",  # synthetic data: the protocol labels it as test
        "gpus": [{"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": H100_BYTES}
                 for i, u in enumerate(uuids)],
        "samples": {"ts": np.repeat(ts, g).tolist(), "gpu_uuid": uuids * n,
                    "gpu_util_pct": util.T.reshape(-1).round(1).tolist(),
                    "memory_used_bytes": mem.T.reshape(-1).astype(np.int64).tolist(),
                    "power_w": power.T.reshape(-1).round(1).tolist()},
    }


def load_fleet(http: httpx.Client, factory, *, gpus: int, hours: int, raw_s: int) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from server.db import session_scope
    from server.ingest.bulk import insert_ignore
    from server.models import Gpu, GpuHourly

    rng = np.random.default_rng(1)
    now = time.time()
    nodes = (gpus + 7) // 8
    for n in range(nodes):
        uuids = [f"GPU-fleet-{n:04d}-{i}" for i in range(min(8, gpus - 8 * n))]
        ts = now - raw_s + np.arange(raw_s, dtype=np.float64)
        busy = rng.random(len(uuids)) < 0.7
        util = np.where(busy, rng.uniform(60, 100, (raw_s, len(uuids))), rng.uniform(0, 3, (raw_s, len(uuids))))
        mem = np.where(busy, rng.uniform(20, 78, (raw_s, len(uuids))), 0.5) * GIB
        _post(http, "/api/v1/ingest/samples", _batch(f"node-{n:04d}", 0, uuids, ts, util, mem, 80 + 6 * util))
    with session_scope(factory) as session:
        ids = [gid for (gid,) in session.execute(select(Gpu.id).order_by(Gpu.id))]
        hour0 = now - now % 3600 - (hours - 1) * 3600
        rows: dict[str, list[object]] = {k: [] for k in ("gpu_id", "hour", "samples", "covered_s", "busy_s",
                                                         "util_busy_s", "energy_j", "memory_peak_bytes",
                                                         "util_mean_pct")}
        for k, gid in enumerate(ids):
            base = rng.uniform(0, 100)
            for h in range(hours):
                util = float(np.clip(base + 25 * np.sin(h / 3 + k) + rng.normal(0, 8), 0, 100))
                for key, v in (("gpu_id", gid), ("hour", hour0 + 3600 * h), ("samples", 3600), ("covered_s", 3600.0),
                               ("busy_s", 36.0 * util), ("util_busy_s", 36.0 * util),
                               ("energy_j", (80 + 6 * util) * 3600.0), ("memory_peak_bytes", int(78 * GIB)),
                               ("util_mean_pct", util)):
                    rows[key].append(v)
        session.query(GpuHourly).delete()
        insert_ignore(session, GpuHourly.__table__, list(rows), list(rows.values()), time_columns=frozenset({"hour"}))


def load_job(http: httpx.Client, *, job_gpus: int, hours: int, job_id: str) -> None:
    rng = np.random.default_rng(2)
    end = time.time() - 60
    start = end - hours * 3600
    uuids = [f"GPU-bigjob-{i}" for i in range(job_gpus)]
    chunk = 3600
    for seq, t in enumerate(np.arange(start, end, chunk)):
        ts = t + np.arange(chunk, dtype=np.float64)
        phase = (ts - start) % 6.0 / 6.0
        busy = np.where(phase < 0.7, 1.0, 0.3)[:, None]
        util = np.clip(95 * busy + rng.normal(0, 3, (chunk, job_gpus)), 0, 100)
        mem = (60 + 8 * busy + rng.normal(0, 0.3, (chunk, job_gpus))) * GIB
        _post(http, "/api/v1/ingest/samples", _batch("node-bigjob", seq, uuids, ts, util, mem, 80 + 3.2 * util))
    _post(http, "/api/v1/jobs", {"job_id": job_id, "team": "vision", "node": "node-bigjob", "gpu_uuids": uuids,
                                 "state": "finished", "started_at": start, "ended_at": end,
                                 "name": f"synthetic {hours} h x {job_gpus} GPU training"})


def time_page(driver, url: str, graphs: int, selectors: list[str], timeout_s: float = 60.0) -> float:  # type: ignore[no-untyped-def]
    driver.get("about:blank")
    t0 = time.perf_counter()
    driver.get(url)
    while time.perf_counter() - t0 < timeout_s:
        if driver.execute_script(DRAWN_JS, graphs, selectors):
            return time.perf_counter() - t0
        time.sleep(0.02)
    driver.save_screenshot("/tmp/fleetprof-bench-timeout.png")
    raise TimeoutError(f"{url} not drawn in {timeout_s} s (screenshot: /tmp/fleetprof-bench-timeout.png)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--fleet-raw-s", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--job-gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--screenshots", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()

    import uvicorn
    from sqlalchemy import create_engine, text

    from server.auth.service import create_token
    from server.config import ServerSettings
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.migrate import upgrade
    from tests.conftest import free_port, wait_http
    from tests.dashboard.conftest import make_chrome

    name = f"fleetprof_bench_{int(time.time())}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    stop = threading.Event()
    driver = None
    try:
        settings = ServerSettings(database_url=url, broker_url=None, data_dir=Path(f"/tmp/{name}"))
        upgrade(settings)
        engine = make_engine(settings)
        factory = make_sessionmaker(engine)
        with session_scope(factory) as session:
            operator = create_token(session, scope="operator")
            agent = create_token(session, scope="agent", node="*")

        from server.app import create_app

        app = create_app(settings)
        if not any(getattr(r, "path", "") == "/api/v1/fleet/timeline" for r in app.routes):
            from server.fleet.dashboard_router import jobs_router, router  # until server/app.py includes them

            app.include_router(router)
            app.include_router(jobs_router)
        api_port, dash_port = free_port(), free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=api_port, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        api = f"http://127.0.0.1:{api_port}"
        wait_http(api + "/healthz")

        t = time.perf_counter()
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {agent}"}, timeout=600) as http_agent, \
                httpx.Client(base_url=api, headers={"Authorization": f"Bearer {operator}"}, timeout=600) as http_op:
            load_job(http_agent, job_gpus=args.job_gpus, hours=args.hours, job_id="bench-job")
            load_fleet(http_agent, factory, gpus=args.gpus, hours=args.hours, raw_s=args.fleet_raw_s)
            now = time.time()
            nodes = (args.gpus + 7) // 8
            for j in range(args.jobs):
                n = j % nodes
                _post(http_op, "/api/v1/jobs", {
                    "job_id": f"fleet-job-{j:03d}", "team": f"team-{j % 5}", "node": f"node-{n:04d}",
                    "gpu_uuids": [f"GPU-fleet-{n:04d}-{i}" for i in range(min(8, args.gpus - 8 * n))],
                    "state": "finished", "started_at": now - args.fleet_raw_s - 5, "ended_at": now,
                    "name": f"synthetic job {j}"})
            http_op.get("/api/v1/jobs/bench-job/report").raise_for_status()  # characterized before timing
        load_s = time.perf_counter() - t

        from dashboard.server import serve_dashboard

        threading.Thread(target=serve_dashboard, args=("127.0.0.1", dash_port, api, None, stop), daemon=True).start()
        dash_url = f"http://127.0.0.1:{dash_port}"
        wait_http(dash_url + "/_dash-layout")
        driver = make_chrome()
        driver.get(f"{dash_url}/?token={operator}")
        time.sleep(3)
        pages = {"fleet": (f"{dash_url}/", 3, ["#fleet-kpis"]),
                 "job": (f"{dash_url}/jobs/bench-job", 4, ["#job-peak-used-value", "#job-energy-source"])}
        rows = []
        args.screenshots.mkdir(parents=True, exist_ok=True)
        for page, (page_url, graphs, selectors) in pages.items():
            time_page(driver, page_url, graphs, selectors)  # warm-up: browser caches, server caches
            runs = [time_page(driver, page_url, graphs, selectors) for _ in range(args.repeat)]
            driver.set_window_size(1400, 1800 if page == "job" else 1500)
            time_page(driver, page_url, graphs, selectors)
            time.sleep(0.5)
            driver.save_screenshot(str(args.screenshots / f"{page}.png"))
            driver.set_window_size(1400, 1000)
            rows.append((page, min(runs), statistics.median(runs), max(runs)))
        print(f"data: {args.gpus} GPUs x {args.hours} h hourly rollups + {args.fleet_raw_s} s raw each, "
              f"{args.jobs} fleet jobs; job page: {args.job_gpus} GPUs x {args.hours} h at 1 Hz "
              f"({args.job_gpus * args.hours * 3600:,} samples); load {load_s:.0f} s")
        print(f"{'page':<8}{'best s':>10}{'median s':>10}{'worst s':>10}   (target <= 2 s; window 1400x1000)")
        for page, best, med, worst in rows:
            print(f"{page:<8}{best:>10.2f}{med:>10.2f}{worst:>10.2f}")
        server.should_exit = True
        engine.dispose()
    finally:
        if driver is not None:
            driver.quit()
        stop.set()
        time.sleep(0.5)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
