"""Fleet load: thousands of simulated nodes, each with the real agent spool + shipper + transport, against two
collector processes (a load balancer stand-in: nodes split across them) and Postgres on this machine.

Every simulated node owns a real `agent.spool.Spool` (its own directory), a real `agent.shipper.Shipper` and a real
`fleetprof.client.Client` (gzip JSON, bearer token, Retry-After); only the NVML sampler is replaced by a generator
of protocol-v1 batches (8 GPUs x 5 one-second samples, the agent's 5-s batch cut), produced in compressed time.
Nodes are multiplexed: a few generator processes, each with one producer thread and a pool of shipper threads
that drive `Shipper.ship_once()` for whichever node has data and is not backing off (a node is shipped by one
thread at a time, in order, exactly as its own shipper thread would).

Phases (one shared clock):
  warm-up     one batch per node (registers 8 GPUs per node), not timed;
  capacity    closed loop, the backlog held just under the collectors' in-flight limit: the saturated rate C;
  sustained   open loop at R = --sustain-fraction x C: GPU-samples/s, p99 ingest latency, CPU per sample;
  overload    open loop at 2R: collectors shed with 503 (or 429) + Retry-After, agents back off and spool;
  recovery    open loop at --recover-fraction x R until every node's backlog is back to normal, then a final
              flush: every sample produced must be acknowledged and stored exactly once.
Collector RSS and CPU are sampled all along. Prints a timeline and a summary table.

    .venv/bin/python bench/fleet_load.py [--nodes 2000] [--procs 2] [--threads 96] [--max-inflight 32]
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing as mp
import os
import queue
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.config import AgentSettings  # noqa: E402
from agent.shipper import Shipper  # noqa: E402
from agent.spool import Spool  # noqa: E402
from bench.report import write_report  # noqa: E402
from fleetprof.client import ApiError, Client  # noqa: E402
from fleetprof.protocol import SampleBatch  # noqa: E402

ADMIN_URL = os.environ.get("FLEETPROF_TEST_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
GPUS, BATCH_S = 8, 5            # a real agent: 8 GPUs sampled at 1 Hz, a batch cut every 5 s
SAMPLES_PER_BATCH = GPUS * BATCH_S
PHASES = ("capacity", "sustained", "overload", "recovery")
# shared counters per generator process: produced, acked, ok requests, shed (429/503), other errors, pending, dupes
N_COUNTERS = 7


# ----------------------------------------------------------------------------------------------- batches

class NodeBatches:
    """Protocol-v1 batches of one simulated node, as the agent's sampler would cut them (columns it fills)."""

    def __init__(self, node: str, agent_id: str, t0: float, index: int):
        uuids = [f"GPU-{node}-{i}" for i in range(GPUS)]
        n = SAMPLES_PER_BATCH
        k = index % 97
        self.t0 = t0
        self.doc = {
            "protocol_version": 1, "node": node, "agent_id": agent_id, "seq": 0, "sent_at": 0.0, "source": "test",
            "node_info": {"hostname": node, "driver_version": "570.124.06", "cuda_version": "12.8"},
            "gpus": [{"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85520809984,
                      "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "power_source": "nvmlDeviceGetPowerUsage",
                      "power_limit_w": 700.0} for i, u in enumerate(uuids)],
            "samples": {
                "ts": [], "gpu_uuid": [uuids[j % GPUS] for j in range(n)], "healthy": [True] * n,
                "memory_used_bytes": [40_000_000_000 + 1_000_000 * (j + k) for j in range(n)],
                "memory_used_max_bytes": [41_000_000_000 + 1_000_000 * (j + k) for j in range(n)],
                "memory_total_bytes": [85520809984] * n,
                "gpu_util_pct": [float((j * 13 + k) % 100) for j in range(n)],
                "mem_util_pct": [float((j * 7 + k) % 60) for j in range(n)],
                "power_w": [350.0 + (j + k) % 200 for j in range(n)],
                "power_max_w": [400.0 + (j + k) % 200 for j in range(n)],
                "energy_counter_j": [],
                "temperature_c": [55.0 + (j + k) % 20 for j in range(n)],
                "sm_clock_mhz": [1980.0] * n, "mem_clock_mhz": [2619.0] * n, "throttle_reasons": [0] * n,
                "pcie_tx_bytes_per_s": [1.0e9 + j for j in range(n)], "pcie_rx_bytes_per_s": [2.0e9 + j for j in range(n)],
                "ecc_corrected_total": [0] * n, "ecc_uncorrected_total": [0] * n,
            },
            "dropped_samples_total": 0,
        }
        SampleBatch.model_validate(self.line_doc(1))  # the shape is the protocol's, checked once per node

    def line_doc(self, seq: int) -> dict:
        doc = self.doc
        doc["seq"] = seq
        doc["sent_at"] = time.time()
        start = self.t0 + (seq - 1) * BATCH_S
        doc["samples"]["ts"] = [start + j // GPUS for j in range(SAMPLES_PER_BATCH)]
        doc["samples"]["energy_counter_j"] = [1e6 + 350.0 * (start - self.t0 + j // GPUS) for j in range(SAMPLES_PER_BATCH)]
        return doc

    def line(self, seq: int) -> str:
        return json.dumps(self.line_doc(seq), separators=(",", ":"))


# ----------------------------------------------------------------------------------------------- generator

class Stats:
    """Per-phase request outcomes of one generator process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase = "warmup"
        self.latency: dict[str, list[float]] = {}
        self.status: dict[str, dict[str, int]] = {}
        self.retry_after: set[float] = set()
        self.acked_by_phase: dict[str, int] = {}
        self.counters = [0.0] * N_COUNTERS

    def ok(self, seconds: float) -> None:
        with self.lock:
            self.latency.setdefault(self.phase, []).append(seconds)
            st = self.status.setdefault(self.phase, {})
            st["200"] = st.get("200", 0) + 1
            self.counters[2] += 1

    def error(self, status: int | None, retry_after: float | None) -> None:
        with self.lock:
            st = self.status.setdefault(self.phase, {})
            key = str(status) if status else "network"
            st[key] = st.get(key, 0) + 1
            if status in (429, 503):
                self.counters[3] += 1
                if retry_after is not None:
                    self.retry_after.add(retry_after)
            else:
                self.counters[4] += 1


class MeteredTransport:
    """The real Client, timed: the shipper calls `request` exactly as it would on a node."""

    def __init__(self, inner: Client, stats: Stats):
        self.inner, self.stats = inner, stats

    def request(self, method: str, path: str, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            resp = self.inner.request(method, path, **kw)
        except ApiError as exc:
            self.stats.error(exc.status, exc.retry_after_s)
            raise
        self.stats.ok(time.perf_counter() - t0)
        return resp


class SimNode:
    __slots__ = ("name", "batches", "spool", "shipper", "seq", "queued", "produced", "acked_seen", "lock")

    def __init__(self, name: str, batches: NodeBatches, spool: Spool, shipper: Shipper):
        self.name, self.batches, self.spool, self.shipper = name, batches, spool, shipper
        self.seq = 0
        self.queued = False     # in the ready queue, in flight or backing off: someone will ship it
        self.produced = 0
        self.acked_seen = 0
        self.lock = threading.Lock()


def generator(idx: int, nodes: list[tuple[str, str]], ports: list[int], args: argparse.Namespace,
              schedule: dict, counters, barrier, results) -> None:  # type: ignore[no-untyped-def]
    """One generator process: len(nodes) simulated agents, one producer thread, args.threads shipper threads."""
    import logging

    logging.basicConfig(level=logging.ERROR)  # the shipper logs every back-off; the timeline says it better
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    settings = AgentSettings()
    stats = Stats()
    spool_root = Path(args.spool_root) / f"gen{idx}"
    clients = [httpx.Client(timeout=settings.http_timeout_s,
                            limits=httpx.Limits(max_connections=args.threads, max_keepalive_connections=args.threads))
               for _ in ports]
    t0 = time.time() - 3600
    sim: list[SimNode] = []
    for i, (name, token) in enumerate(nodes):
        port_i = (i + idx) % len(ports)  # alternate collectors, like a round-robin load balancer
        transport = Client(f"http://127.0.0.1:{ports[port_i]}", token, http_client=clients[port_i],
                              timeout_s=settings.http_timeout_s)
        spool = Spool(spool_root / name, max_bytes=settings.spool_max_bytes, fsync=args.fsync)
        shipper = Shipper(spool, MeteredTransport(transport, stats), backoff_max_s=settings.ship_backoff_max_s)
        sim.append(SimNode(name, NodeBatches(name, f"{name}-sim", t0, i), spool, shipper))

    ready: queue.SimpleQueue[SimNode | None] = queue.SimpleQueue()
    delayed: list[tuple[float, int, SimNode]] = []
    delayed_lock = threading.Lock()
    stop = threading.Event()
    tiebreak = iter(range(1 << 62))

    def pending_samples() -> int:
        return int(stats.counters[0] - stats.counters[1])

    def produce(node: SimNode) -> None:
        node.seq += 1
        node.spool.append(node.batches.line(node.seq), SAMPLES_PER_BATCH)
        node.produced += SAMPLES_PER_BATCH
        with stats.lock:
            stats.counters[0] += SAMPLES_PER_BATCH
        with node.lock:
            if node.queued:
                return
            node.queued = True
        ready.put(node)

    def ship_loop() -> None:
        while True:
            node = ready.get()
            if node is None:
                return
            before = node.shipper.sent_batches
            dup_before = node.shipper.duplicate_batches
            try:
                delay = node.shipper.ship_once()
            except Exception:  # noqa: BLE001 - as the agent's shipper thread: never die, retry later
                delay = settings.ship_backoff_max_s
            if node.shipper.sent_batches != before:
                with stats.lock:
                    stats.counters[1] += SAMPLES_PER_BATCH
                    stats.counters[6] += node.shipper.duplicate_batches - dup_before
                    stats.acked_by_phase[stats.phase] = stats.acked_by_phase.get(stats.phase, 0) + SAMPLES_PER_BATCH
            if delay is not None:
                with delayed_lock:
                    heapq.heappush(delayed, (time.monotonic() + delay, next(tiebreak), node))
                continue
            with node.lock:
                if len(node.spool) == 0:
                    node.queued = False
                    continue
            ready.put(node)  # more spooled: back of the line, so that every node gets its turn

    def timer_loop() -> None:
        while not stop.is_set():
            now = time.monotonic()
            with delayed_lock:
                while delayed and delayed[0][0] <= now:
                    ready.put(heapq.heappop(delayed)[2])
            time.sleep(0.01)

    def publish_loop() -> None:
        while not stop.is_set():
            with stats.lock:
                c = list(stats.counters)
            c[5] = c[0] - c[1]
            for j in range(N_COUNTERS):
                counters[idx * N_COUNTERS + j] = c[j]
            time.sleep(0.2)

    threads = [threading.Thread(target=ship_loop, daemon=True) for _ in range(args.threads)]
    threads += [threading.Thread(target=timer_loop, daemon=True), threading.Thread(target=publish_loop, daemon=True)]
    for t in threads:
        t.start()

    def wait_drained(deadline: float, level: int = 0) -> bool:
        while pending_samples() > level and time.monotonic() < deadline:
            time.sleep(0.05)
        return pending_samples() <= level

    # warm-up: one batch per node, so that the GPU inventory exists before anything is timed
    for node in sim:
        produce(node)
    wait_drained(time.monotonic() + 120)
    barrier.wait()
    start = schedule["start"].value
    local_share = len(nodes) / args.nodes
    rr = 0

    def produce_n(count: int) -> None:
        nonlocal rr
        for _ in range(count):
            produce(sim[rr % len(sim)])
            rr += 1

    report: dict = {"idx": idx, "phase_rate": {}, "caught_up_s": None}
    cpu_marks: list[tuple[str, float]] = []
    sustained_backlog_max = 0
    for phase in PHASES:
        p_start, p_end = start + schedule[phase][0], start + schedule[phase][1]
        while time.monotonic() < p_start:
            time.sleep(0.01)
        with stats.lock:
            stats.phase = phase
        cpu_marks.append((phase, time.process_time()))
        if phase == "capacity":
            target = args.capacity_backlog * local_share  # batches in flight or queued, below the shed limit
            while time.monotonic() < p_end:
                missing = int(target - pending_samples() / SAMPLES_PER_BATCH)
                if missing > 0:
                    produce_n(missing)
                time.sleep(0.002)
            acked = stats.acked_by_phase.get("capacity", 0)
            capacity_local = acked / (schedule["capacity"][1] - schedule["capacity"][0])
            report["capacity"] = capacity_local
            rate = capacity_local * args.sustain_fraction
            if args.rate:
                rate = args.rate * local_share
            report["phase_rate"]["sustained"] = rate
            report["phase_rate"]["overload"] = 2 * rate
            report["phase_rate"]["recovery"] = args.recover_fraction * rate
            continue
        rate = report["phase_rate"][phase]  # GPU-samples/s offered by this process
        made = 0
        t_phase = time.monotonic()
        end = p_end if phase != "recovery" else p_start + args.recovery_max_s
        while time.monotonic() < end:
            due = int((time.monotonic() - t_phase) * rate / SAMPLES_PER_BATCH) - made
            if due > 0:
                produce_n(due)
                made += due
            if phase == "sustained":
                sustained_backlog_max = max(sustained_backlog_max, pending_samples())
            if phase == "recovery" and report["caught_up_s"] is None and time.monotonic() > t_phase + 1 \
                    and pending_samples() <= max(sustained_backlog_max, SAMPLES_PER_BATCH * args.threads):
                report["caught_up_s"] = time.monotonic() - t_phase
                break
            time.sleep(0.005)
        if phase == "sustained":
            report["sustained_backlog_end"] = pending_samples()
            report["sustained_backlog_max"] = sustained_backlog_max
        if phase == "overload":
            report["overload_backlog_end"] = pending_samples()
    # final flush: production has stopped; every spooled batch must be acknowledged
    t_flush = time.monotonic()
    report["drained"] = wait_drained(t_flush + args.recovery_max_s)
    report["flush_s"] = time.monotonic() - t_flush
    report["drain_end"] = time.monotonic() - start
    cpu_marks.append(("end", time.process_time()))
    report["cpu_marks"] = cpu_marks
    stop.set()
    for _ in range(args.threads):
        ready.put(None)
    for t in threads[: args.threads]:
        t.join(timeout=settings.http_timeout_s + 5)
    with stats.lock:
        report.update(latency=stats.latency, status=stats.status, retry_after=sorted(stats.retry_after),
                      acked_by_phase=stats.acked_by_phase, counters=list(stats.counters),
                      produced=sum(n.produced for n in sim), batches=sum(n.seq for n in sim),
                      spool_left=sum(len(n.spool) for n in sim),
                      dropped=sum(n.spool.dropped_samples_total for n in sim))
    for n in sim:
        n.spool.close()
    for c in clients:
        c.close()
    results.put(report)


# ----------------------------------------------------------------------------------------------- main

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def backend_cpu(engine, db: str) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """CPU seconds of each Postgres backend serving this benchmark's database (the collectors' pooled
    connections), by pid: other databases on the same server (other test suites) are not counted."""
    with engine.connect() as conn:
        pids = [r[0] for r in conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :d "
                                                "AND pid <> pg_backend_pid()"), {"d": db})]
    out: dict[int, float] = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def main() -> int:
    global BATCH_S, SAMPLES_PER_BATCH  # set from --batch-seconds, read by the forked generator processes
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000, help="simulated GPU nodes (8 GPUs each)")
    parser.add_argument("--procs", type=int, default=2, help="generator processes the nodes are multiplexed on")
    parser.add_argument("--threads", type=int, default=96, help="shipper threads per generator process")
    parser.add_argument("--max-inflight", type=int, default=64,
                        help="FLEETPROF_MAX_INFLIGHT_INGEST of each collector (past it: 503 + Retry-After)")
    parser.add_argument("--capacity-backlog", type=int, default=40,
                        help="batches kept queued/in flight while measuring capacity (below 2 x max-inflight)")
    parser.add_argument("--capacity-s", type=float, default=15)
    parser.add_argument("--sustained-s", type=float, default=45)
    parser.add_argument("--overload-s", type=float, default=40)
    parser.add_argument("--recovery-max-s", type=float, default=90)
    parser.add_argument("--sustain-fraction", type=float, default=0.8, help="R = this x the measured capacity")
    parser.add_argument("--recover-fraction", type=float, default=0.25, help="production after the overload, x R")
    parser.add_argument("--rate", type=float, default=0, help="sustained GPU-samples/s (default: from capacity)")
    parser.add_argument("--fsync", action="store_true", help="fsync every spool append, as a real agent does")
    parser.add_argument("--batch-seconds", type=int, default=BATCH_S,
                        help="samples per GPU per batch (the agent's FLEETPROF_BATCH_INTERVAL_S at 1 Hz)")
    parser.add_argument("--ports", default="8771,8772")
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    t_begin = time.monotonic()
    BATCH_S, SAMPLES_PER_BATCH = args.batch_seconds, GPUS * args.batch_seconds

    db = f"fleetprof_fleetload_{os.getpid()}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db}"'))
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{db}"
    servers: list[subprocess.Popen] = []
    workdir = Path(tempfile.mkdtemp(prefix="fleetprof-fleetload-"))
    gens: list[mp.Process] = []
    try:
        from server.auth.service import create_token
        from server.config import ServerSettings
        from server.db import make_engine, make_sessionmaker, session_scope
        from server.migrate import upgrade

        settings = ServerSettings(database_url=url)
        upgrade(settings)
        engine = make_engine(settings)
        names = [f"sim{i:05d}" for i in range(args.nodes)]
        t = time.perf_counter()
        with session_scope(make_sessionmaker(engine)) as session:
            tokens = {n: create_token(session, scope="agent", node=n) for n in names}
        setup_tokens_s = time.perf_counter() - t
        env = {**os.environ, "FLEETPROF_DATABASE_URL": url, "FLEETPROF_DATA_DIR": str(workdir / "data"),
               "FLEETPROF_ENVIRONMENT": "production", "FLEETPROF_MAX_INFLIGHT_INGEST": str(args.max_inflight)}
        env.pop("FLEETPROF_BROKER_URL", None)
        for port in ports:
            servers.append(subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "server", "--port", str(port),
                                             "--log-level", "warning"], env=env, cwd=ROOT))
        for port in ports:
            for _ in range(150):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            else:
                raise RuntimeError(f"collector on :{port} did not start")
        collectors = [psutil.Process(s.pid) for s in servers]

        schedule_offsets = {}
        t_at = 0.0
        for phase, length in (("capacity", args.capacity_s), ("sustained", args.sustained_s),
                              ("overload", args.overload_s), ("recovery", args.recovery_max_s)):
            if phase == "sustained":
                t_at += 3.0  # the capacity phase's small backlog drains before the open-loop phases
            schedule_offsets[phase] = (t_at, t_at + length)
            t_at += length
        ctx = mp.get_context("fork")
        start_value = ctx.Value("d", 0.0)
        counters = ctx.Array("d", args.procs * N_COUNTERS)
        results = ctx.Queue()

        def set_start() -> None:
            start_value.value = time.monotonic() + 0.3

        barrier = ctx.Barrier(args.procs + 1, action=set_start)
        schedule = {**schedule_offsets, "start": start_value}
        args.spool_root = str(workdir / "spools")
        share = [names[i::args.procs] for i in range(args.procs)]
        print(f"fleet_load: {args.nodes} simulated nodes x {GPUS} GPUs on {args.procs} processes x {args.threads} "
              f"shipper threads -> 2 collectors (:{ports[0]}, :{ports[1]}), FLEETPROF_MAX_INFLIGHT_INGEST="
              f"{args.max_inflight}; {len(tokens)} agent tokens in {setup_tokens_s:.1f} s", flush=True)
        t_warm = time.monotonic()
        for i in range(args.procs):
            p = ctx.Process(target=generator, args=(i, [(n, tokens[n]) for n in share[i]], ports, args, schedule,
                                                    counters, barrier, results), daemon=True)
            p.start()
            gens.append(p)
        barrier.wait(timeout=600)
        start = start_value.value
        print(f"warm-up: {args.nodes} nodes registered their GPUs in {time.monotonic() - t_warm:.1f} s; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)

        # ---- observe: timeline rows every 5 s, RSS every 0.5 s, CPU at phase boundaries
        def phase_at(t: float) -> str:
            for ph in PHASES:
                a, b = schedule_offsets[ph]
                if a <= t < b:
                    return ph
            return "gap" if t < schedule_offsets["recovery"][0] else "flush"

        def totals() -> list[float]:
            c = list(counters)
            return [sum(c[i * N_COUNTERS + j] for i in range(args.procs)) for j in range(N_COUNTERS)]

        rss: dict[str, list[float]] = {}
        pg_seen: dict[int, float] = {}  # last CPU seen per backend pid (pooled connections come and go)

        def pg_cpu() -> float:
            pg_seen.update(backend_cpu(engine, db))
            return sum(pg_seen.values())

        cpu_marks: dict[str, tuple[float, ...]] = {}
        last_row = (time.monotonic(), totals())
        print(f"\n{'t_s':>5} {'phase':<10} {'acked/s':>9} {'shed/s':>7} {'err/s':>6} {'backlog':>9} "
              f"{'RSS MB':>13} {'load':>5}")
        current = None
        while any(p.is_alive() for p in gens) and results.qsize() < args.procs:
            now = time.monotonic()
            ph = phase_at(now - start) if now >= start else "warmup"
            if ph != current:
                acked = totals()[1]
                cpu_marks[ph] = (now, cpu_s(collectors), acked, pg_cpu())
                if current is not None:
                    cpu_marks[current + ":end"] = cpu_marks[ph]
                current = ph
            pg_cpu()
            mem = [p.memory_info().rss / 2**20 for p in collectors if p.is_running()]
            rss.setdefault(ph, []).append(max(mem) if mem else float("nan"))
            if now - last_row[0] >= 5:
                tot = totals()
                dt = now - last_row[0]
                d = [(tot[j] - last_row[1][j]) / dt for j in range(N_COUNTERS)]
                print(f"{now - start:5.0f} {ph:<10} {d[1]:9,.0f} {d[3]:7,.0f} {d[4]:6,.0f} {tot[5]:9,.0f} "
                      f"{' / '.join(f'{m:.0f}' for m in mem):>13} {os.getloadavg()[0]:5.2f}", flush=True)
                last_row = (now, tot)
            for s in servers:
                if s.poll() is not None:
                    raise RuntimeError(f"a collector exited with status {s.returncode}")
            time.sleep(0.5)
        end_marks = (time.monotonic(), cpu_s(collectors), totals()[1], pg_cpu())
        cpu_marks.setdefault(current + ":end", end_marks)
        reports = [results.get(timeout=120) for _ in range(args.procs)]
        for p in gens:
            p.join(timeout=30)
        alive = all(s.poll() is None for s in servers)

        time.sleep(1.5)  # Postgres backends flush their table statistics within a second of going idle
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM gpu_samples")).scalar()
            batches_db, rows_db = conn.execute(
                text("SELECT count(*), coalesce(sum(rows), 0) FROM ingest_batches WHERE kind = 'samples'")).one()
            # inventory writes per batch: the collector re-syncs a node's row and its GPUs' rows whenever its
            # cache entry is older than the refresh interval (server/nodes/service.py)
            inv_updates = conn.execute(text("SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables "
                                            "WHERE relname IN ('nodes', 'gpus')")).scalar()
        engine.dispose()

        # ---- summary
        def merged(key: str, phase: str) -> list[float]:
            out: list[float] = []
            for r in reports:
                out += r[key].get(phase, [])
            return out

        def status(phase: str) -> dict[str, int]:
            out: dict[str, int] = {}
            for r in reports:
                for k, v in r["status"].get(phase, {}).items():
                    out[k] = out.get(k, 0) + v
            return out

        def phase_cpu(phase: str) -> tuple[float, ...]:
            a, b = cpu_marks.get(phase), cpu_marks.get(phase + ":end")
            if not a or not b:
                return (float("nan"),) * 4 + (gen_cpu(phase),)
            return b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3], gen_cpu(phase)

        def gen_cpu(phase: str) -> float:
            total = 0.0
            for r in reports:
                marks = r["cpu_marks"]
                names = [m[0] for m in marks]
                if phase in names:
                    i = names.index(phase)
                    total += marks[i + 1][1] - marks[i][1]
            return total

        capacity = sum(r["capacity"] for r in reports)
        rate_r = sum(r["phase_rate"]["sustained"] for r in reports)
        produced = sum(r["produced"] for r in reports)
        acked_total = sum(r["counters"][1] for r in reports)
        dupes = sum(r["counters"][6] for r in reports)
        spool_left = sum(r["spool_left"] for r in reports)
        dropped = sum(r["dropped"] for r in reports)
        retry_after = sorted({v for r in reports for v in r["retry_after"]})
        caught = [r["caught_up_s"] for r in reports]
        flush_s = max(r["flush_s"] for r in reports)
        print()
        rows: list[tuple[str, str]] = []
        rows.append(("simulated nodes / GPUs", f"{args.nodes} / {args.nodes * GPUS}"))
        rows.append((f"batch (agent's {BATCH_S}-s cut)", f"{GPUS} GPUs x {BATCH_S} samples = {SAMPLES_PER_BATCH} GPU-samples, "
                                                 f"{len(NodeBatches('x', 'x', 1e9, 0).doc['samples'])} sample columns"))
        rows.append(("capacity (closed loop)", f"{capacity:,.0f} GPU-samples/s"))
        phases: dict[str, dict[str, object]] = {}
        for ph in ("sustained", "overload", "recovery"):
            dur, dcpu, dacked, dpg, dgen = phase_cpu(ph)
            lat = merged("latency", ph)
            st = status(ph)
            offered = sum(r["phase_rate"][ph] for r in reports)
            comp = offered / (args.nodes * GPUS)
            phases[ph] = {
                "offered_samples_per_s": offered, "acknowledged_samples_per_s": dacked / dur, "duration_s": dur,
                "latency_p50_ms": pct(lat, 0.5) * 1e3, "latency_p99_ms": pct(lat, 0.99) * 1e3,
                "acknowledged_requests_count": len(lat), "responses": {f"http_{k}_count": v for k, v in st.items()},
                "collector_cpu_per_sample_us": dcpu / dacked * 1e6 if dacked > 0 else None,
                "postgres_cpu_per_sample_us": dpg / dacked * 1e6 if dacked > 0 else None,
                "collector_rss_max_bytes": max(rss.get(ph, [float("nan")])) * 2**20}  # rss is in MiB
            rows.append((f"[{ph}] offered", f"{offered:,.0f} GPU-samples/s (time x{comp:.2f} real time per node)"))
            rows.append((f"[{ph}] acknowledged", f"{dacked / dur:,.0f} GPU-samples/s over {dur:.0f} s"))
            rows.append((f"[{ph}] ingest latency p50/p99", f"{pct(lat, 0.5) * 1e3:.1f} / {pct(lat, 0.99) * 1e3:.1f} ms"
                                                             f" ({len(lat)} acknowledged requests)"))
            rows.append((f"[{ph}] responses", ", ".join(f"{k}: {v}" for k, v in sorted(st.items()))))
            if dacked > 0:
                rows.append((f"[{ph}] collector CPU / sample", f"{dcpu / dacked * 1e6:.1f} us "
                                                                f"({dcpu / dur:.2f} cores for 2 collectors)"))
                rows.append((f"[{ph}] postgres CPU / sample", f"{dpg / dacked * 1e6:.1f} us (this database's backends)"))
                rows.append((f"[{ph}] load generator CPU", f"{dgen / dur:.2f} cores ({dgen / dacked * 1e6:.1f} us / sample)"))
            rows.append((f"[{ph}] collector RSS max", f"{max(rss.get(ph, [float('nan')])):.0f} MB"))
        rows.append(("sustained backlog at end / max", f"{sum(r['sustained_backlog_end'] for r in reports):,} / "
                                                        f"{sum(r['sustained_backlog_max'] for r in reports):,} samples"))
        # Held: acknowledged at >= 95 % of the offered rate. On a machine whose cores the generator shares with the
        # collectors and Postgres, the closed-loop capacity can be out of reach open-loop: then this says so.
        s_dur, _, s_acked, _, _ = phase_cpu("sustained")
        s_offered = sum(r["phase_rate"]["sustained"] for r in reports)
        held = s_acked / s_dur >= 0.95 * s_offered
        rows.append(("sustained rate held", f"{'yes' if held else 'NO'}: {s_acked / s_dur:,.0f} of {s_offered:,.0f} "
                                             "GPU-samples/s acknowledged" + ("" if held else
                                             " (lower --sustain-fraction to find the rate this machine holds)")))
        rows.append(("overload backlog at end", f"{sum(r['overload_backlog_end'] for r in reports):,} samples spooled"))
        rows.append(("Retry-After seen", ", ".join(f"{v:g} s" for v in retry_after) or "none"))
        rows.append(("caught up after overload", " / ".join("not yet" if c is None else f"{c:.0f} s" for c in caught)
                     + f" (per generator), final flush {flush_s:.0f} s"))
        rows.append(("collectors alive at the end", "yes" if alive else "NO"))
        rows.append(("GPU-samples produced", f"{produced:,} in {sum(r['batches'] for r in reports):,} batches"))
        rows.append(("GPU-samples acknowledged", f"{acked_total:,.0f} ({dupes:.0f} duplicate acks)"))
        rows.append(("GPU-samples in database", f"{stored:,} ({batches_db:,} batches, {rows_db:,} rows recorded)"))
        rows.append(("inventory row updates / batch", f"{inv_updates / max(1, batches_db):.2f} (nodes + gpus rows)"))
        rows.append(("left in spools / dropped", f"{spool_left} batches / {dropped} samples"))
        rows.append(("benchmark wall time", f"{time.monotonic() - t_begin:.0f} s"))
        rows.append(("load average (1 min)", f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"))
        shed = {k: v for k, v in status("overload").items() if k in ("429", "503")}
        rss_base = max(rss.get("capacity", [float("nan")]))
        rss_peak = max(max(v) for v in rss.values())
        rows.append(("overload shed with Retry-After", ("yes: " + ", ".join(f"{k} x{v}" for k, v in shed.items()))
                     if shed and retry_after else "NO"))
        rows.append(("collector memory bounded", f"{'yes' if rss_peak <= max(1.5 * rss_base, rss_base + 200) else 'NO'}"
                                                  f" (peak {rss_peak:.0f} MB vs {rss_base:.0f} MB at capacity)"))
        if all(c is not None for c in caught):
            verdict = "yes, while still producing"
        elif all(r["drained"] for r in reports):
            verdict = f"yes, {flush_s:.0f} s after production stopped (not within --recovery-max-s while producing)"
        else:
            verdict = "NO"
        rows.append(("agents caught up", verdict))
        ok = (produced == acked_total == stored == rows_db) and spool_left == 0 and dropped == 0 and alive
        rows.append(("exactly-once check", "OK" if ok else "FAILED"))
        width = max(len(k) for k, _ in rows) + 2
        for k, v in rows:
            print(f"{k:<{width}}{v}")
        print(f"\nsustainable rate R = {args.sustain_fraction:g} x capacity = {rate_r:,.0f} GPU-samples/s "
              f"({rate_r / (args.nodes * GPUS):.2f} x real time for {args.nodes} nodes at 1 Hz)")
        write_report(__file__, {
            "nodes_count": args.nodes, "gpus_count": args.nodes * GPUS, "capacity_samples_per_s": capacity,
            "sustainable_rate_samples_per_s": rate_r, "sustained_rate_held_ok": held, "phases": phases,
            "collector_rss_peak_bytes": rss_peak * 2**20, "produced_samples_count": produced,
            "acknowledged_samples_count": acked_total, "stored_samples_count": stored, "spool_left_batches_count": spool_left,
            "dropped_samples_count": dropped, "retry_after_s": retry_after, "collectors_alive_ok": alive,
            "exactly_once_ok": ok, "wall_s": time.monotonic() - t_begin})
        return 0 if ok else 1
    finally:
        for p in gens:
            if p.is_alive():
                p.terminate()
        for s in servers:
            s.terminate()
        for s in servers:
            try:
                s.wait(15)
            except subprocess.TimeoutExpired:
                s.kill()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
