"""Ingest throughput: many simulated nodes POSTing agent batches to one collector process on Postgres.

Each node sends what a real agent sends: protocol v1 SampleBatch JSON, gzip, 8 GPUs x 10 samples per request
(80 GPU-samples), with its own agent token. Bodies are pre-encoded so the load generator measures the collector,
not itself. Prints sustained GPU-samples/s, request latency p50/p99, and a count check that every acknowledged
sample is in the database exactly once.

    .venv/bin/python bench/ingest.py [--nodes 64] [--batches 60] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil
from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from bench.scratch import fleetprof_server, scratch_database  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.migrate import upgrade  # noqa: E402

GPUS, STEPS = 8, 10


def make_body(node: str, seq: int, t0: float) -> bytes:
    uuids = [f"GPU-{node}-{i}" for i in range(GPUS)]
    ts, gpu, mem, mem_max, util, power, energy, temp, sm = [], [], [], [], [], [], [], [], []
    for k in range(STEPS):
        t = t0 + seq * STEPS + k
        for i, u in enumerate(uuids):
            ts.append(t)
            gpu.append(u)
            mem.append(30_000_000_000 + 1_000_000 * k + i)
            mem_max.append(31_000_000_000 + 1_000_000 * k + i)
            util.append(float((k * 13 + i) % 100))
            power.append(300.0 + k + i / 10)
            energy.append(1e6 + (seq * STEPS + k) * 300.0)
            temp.append(60.0)
            sm.append(1980.0)
    batch = {
        "protocol_version": 1, "node": node, "agent_id": f"bench-{node}", "seq": seq, "sent_at": time.time(),
        "source": "test",
        "gpus": [{"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85520809984,
                  "power_source": "nvmlDeviceGetPowerUsage"} for i, u in enumerate(uuids)],
        "samples": {"ts": ts, "gpu_uuid": gpu, "memory_used_bytes": mem, "memory_used_max_bytes": mem_max,
                    "gpu_util_pct": util, "power_w": power, "energy_counter_j": energy, "temperature_c": temp,
                    "sm_clock_mhz": sm},
    }
    return gzip.compress(json.dumps(batch, separators=(",", ":")).encode(), compresslevel=5)


class RawConnection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: the generator must cost far less than the server."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await self.writer.drain()
        assert self.reader is not None
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        resp_headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            resp_headers[k.strip().lower()] = v.strip()
        payload = await self.reader.readexactly(int(resp_headers.get("content-length", "0")))
        return status, resp_headers, payload


async def node_loop(conns: asyncio.Queue, token: str, bodies: list[bytes], latencies: list[float],
                    acked: list[int]) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    for body in bodies:
        while True:
            conn = await conns.get()
            try:
                start = time.perf_counter()
                status, resp_headers, payload = await conn.post("/api/v1/ingest/samples", body, headers)
                elapsed = time.perf_counter() - start
            finally:
                conns.put_nowait(conn)
            if status == 200:
                latencies.append(elapsed)
                acked.append(json.loads(payload)["accepted"])
                break
            if status in (429, 503):
                await asyncio.sleep(float(resp_headers.get("retry-after", "1")))
                continue
            raise RuntimeError(f"HTTP {status}: {payload[:300]!r}")


async def drive(port: int, tokens: dict[str, str], bodies: dict[str, list[bytes]], concurrency: int) -> dict:
    latencies: list[float] = []
    acked: list[int] = []
    conns: asyncio.Queue = asyncio.Queue()
    for _ in range(concurrency):
        conns.put_nowait(RawConnection("127.0.0.1", port))
    start = time.perf_counter()
    await asyncio.gather(*(node_loop(conns, tokens[n], bodies[n], latencies, acked) for n in bodies))
    wall = time.perf_counter() - start
    return {"wall_s": wall, "latencies": latencies, "acked": sum(acked)}


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _postgres_cpu() -> dict[int, float]:
    """CPU seconds so far of every Postgres process, by pid."""
    out = {}
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] and proc.info["name"].startswith("postgres"):
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except psutil.Error:
                pass
    return out


def _postgres_cpu_s(engine, db: str, before: dict[int, float]) -> float:  # type: ignore[no-untyped-def]
    """CPU spent since `before` by the backends serving the bench database and by the shared WAL writer,
    checkpointer and background writer (other databases' backends on this machine are not counted)."""
    with engine.connect() as conn:
        pids = set(conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = :db OR backend_type IN "
            "('walwriter', 'checkpointer', 'background writer')"), {"db": db}).scalars())
    now = _postgres_cpu()
    return sum(now[pid] - before.get(pid, 0.0) for pid in pids if pid in now)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--batches", type=int, default=60, help="batches per node")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    with scratch_database("fleetprof_bench") as url, ExitStack() as stack:
        db = url.rsplit("/", 1)[1]
        settings = ServerSettings(database_url=url)
        upgrade(settings)
        from server.auth.service import create_token
        from server.db import make_engine, make_sessionmaker, session_scope

        engine = make_engine(settings)
        nodes = [f"node{i:04d}" for i in range(args.nodes)]
        with session_scope(make_sessionmaker(engine)) as session:
            tokens = {n: create_token(session, scope="agent", node=n) for n in nodes}
        t0 = time.time() - 7 * 86400
        bodies = {n: [make_body(n, s, t0) for s in range(args.batches)] for n in nodes}
        env = {**os.environ, "FLEETPROF_DATABASE_URL": url, "FLEETPROF_DATA_DIR": tempfile.mkdtemp()}
        _, server = stack.enter_context(fleetprof_server(env, args.port, ROOT))
        cpu0 = os.times()
        collector = psutil.Process(server.pid)
        profile = os.environ.get("FLEETPROF_BENCH_PYSPY")  # profile the collector with py-spy into that file:
        if profile:  # a flame graph (.svg) or collapsed stacks (.txt)
            fmt = "raw" if profile.endswith(".txt") else "flamegraph"
            subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-f", fmt, "-o", profile,
                              "-r", "200", "--gil", "-p", str(server.pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        collector_cpu0 = _cpu_s(collector)
        postgres_cpu0 = _postgres_cpu()
        result = asyncio.run(drive(args.port, tokens, bodies, args.concurrency))
        collector_cpu = _cpu_s(collector) - collector_cpu0
        postgres_cpu = _postgres_cpu_s(engine, db, postgres_cpu0)
        load1 = os.getloadavg()[0]
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM gpu_samples")).scalar()
            distinct = conn.execute(text("SELECT count(*) FROM (SELECT DISTINCT gpu_id, ts FROM gpu_samples) s")).scalar()
        engine.dispose()
        sent = args.nodes * args.batches * GPUS * STEPS
        lat = sorted(result["latencies"])
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
        print(f"{'nodes':<34}{args.nodes}")
        print(f"{'requests (8 GPUs x 10 samples)':<34}{len(lat)}")
        print(f"{'concurrency':<34}{args.concurrency}")
        print(f"{'GPU-samples sent':<34}{sent}")
        print(f"{'GPU-samples acknowledged':<34}{result['acked']}")
        print(f"{'GPU-samples in database':<34}{stored} ({distinct} distinct)")
        print(f"{'wall time':<34}{result['wall_s']:.2f} s")
        print(f"{'sustained GPU-samples/s':<34}{sent / result['wall_s']:,.0f}")
        print(f"{'request latency p50 / p99':<34}{p(0.5):.1f} ms / {p(0.99):.1f} ms")
        client_cpu = os.times().user - cpu0.user + os.times().system - cpu0.system
        us = lambda cpu: cpu / sent * 1e6  # noqa: E731
        print(f"{'CPU per GPU-sample: collector':<34}{us(collector_cpu):.1f} us ({collector_cpu:.1f} s)")
        print(f"{'CPU per GPU-sample: Postgres':<34}{us(postgres_cpu):.1f} us ({postgres_cpu:.1f} s, this database's backends + WAL)")
        print(f"{'CPU per GPU-sample: load gen.':<34}{us(client_cpu):.1f} us ({client_cpu:.1f} s)")
        print(f"{'machine':<34}{psutil.cpu_count()} cores, load average {load1:.1f} at the end")
        ok = result["acked"] == sent == stored == distinct
        print(f"{'exactly-once check':<34}{'OK' if ok else 'FAILED'}")
        write_report(__file__, {
            "nodes_count": args.nodes, "requests_count": len(lat), "concurrency_count": args.concurrency,
            "sent_samples_count": sent, "acknowledged_samples_count": result["acked"], "stored_samples_count": stored,
            "distinct_samples_count": distinct, "wall_s": result["wall_s"], "sustained_samples_per_s": sent / result["wall_s"],
            "latency_p50_ms": p(0.5), "latency_p99_ms": p(0.99), "collector_cpu_per_sample_us": us(collector_cpu),
            "postgres_cpu_per_sample_us": us(postgres_cpu), "load_generator_cpu_per_sample_us": us(client_cpu),
            "load_average_1min_ratio": load1, "exactly_once_ok": ok})
        return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
