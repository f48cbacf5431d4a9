"""Agent overhead: CPU (% of one core) and RSS of `fleetprof agent` sampling N GPUs, shipping to a real HTTP sink.

    .venv/bin/python bench/agent_overhead.py                      # 8 simulated GPUs, 1 Hz, 45 s
    .venv/bin/python bench/agent_overhead.py --source nvml        # the real GPUs of this machine

The agent runs as a real subprocess (`python -m fleetprof.cli agent`), with its 10 Hz peak sampling, spool
(fsync'ed) and shipper; the sink is an HTTP server in this process that acknowledges every batch. With
`fake:N` the device is the pynvml test double with the per-call latencies and CPU shares measured on an H100
(agent/devices/fake.py: the CPU share of a call is spent spinning on the thread's CPU clock, the rest asleep).
Target: <= 0.5 % of one core and <= 60 MB RSS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.report import write_report  # noqa: E402

TARGET_CPU_PCT = 0.5  # % of one core
TARGET_RSS_MB = 60.0


class Sink:
    def __init__(self) -> None:
        self.batches = 0
        self.samples = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            # keep-alive, as the collector (uvicorn) does: HTTP/1.0 would close the connection after every batch
            # and charge the agent a TCP connect per batch that it does not pay against the real server
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.bytes += len(raw)
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                body = json.loads(raw)
                sink.batches += 1
                sink.samples += len(body["samples"]["ts"])
                data = json.dumps({"accepted": len(body["samples"]["ts"]), "duplicate": False,
                                   "server_time": time.time()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--source", default=None, help="fake:N (default, N = --gpus) or nvml")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=45.0, help="measured seconds (after the warm-up)")
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    source = args.source or f"fake:{args.gpus}"
    sink = Sink()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETPROF_INTERVAL_S": str(args.interval)}
        cmd = [sys.executable, "-m", "fleetprof.cli", "agent", "--server", sink.url, "--token", "bench",
               "--source", source, "--spool", str(Path(tmp) / "spool"), "--node", "bench", "--log-level", "WARNING"]
        log_path = Path(tmp) / "agent.log"
        log = open(log_path, "w")
        proc = psutil.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(args.warmup)
            c0, t0, b0, s0 = proc.cpu_times(), time.monotonic(), sink.batches, sink.samples
            rss: list[int] = []
            while time.monotonic() - t0 < args.duration:
                rss.append(proc.memory_info().rss)
                time.sleep(1.0)
            c1, t1 = proc.cpu_times(), time.monotonic()
            batches, samples = sink.batches - b0, sink.samples - s0
        except psutil.NoSuchProcess:  # the agent exited: say why (its log), not where psutil noticed
            log.close()
            print(f"agent exited early with status {proc.wait(5)}; its log:\n{log_path.read_text()[-4000:]}",
                  file=sys.stderr)
            return 1
        finally:
            if proc.is_running():
                proc.terminate()
                proc.wait(15)
            log.close()
    wall = t1 - t0
    user, system = c1.user - c0.user, c1.system - c0.system
    cpu_pct = 100.0 * (user + system) / wall
    rss_mb = max(rss) / 1e6
    rows = [
        ("source", source),
        ("interval / peak sampling", f"{args.interval:g} s / 0.1 s"),
        ("measured wall time", f"{wall:.1f} s (after {args.warmup:g} s warm-up)"),
        ("CPU, % of one core", f"{cpu_pct:.2f} %  (user {100 * user / wall:.2f} %, system {100 * system / wall:.2f} %)"),
        ("RSS max / last", f"{rss_mb:.1f} MB / {rss[-1] / 1e6:.1f} MB"),
        ("batches / samples received", f"{batches} / {samples}  ({samples / wall:.1f} samples/s)"),
        ("bytes on the wire (gzip)", f"{sink.bytes / 1e3:.0f} kB total"),
        ("target", f"<= {TARGET_CPU_PCT:g} % of one core, <= {TARGET_RSS_MB:g} MB RSS: "
                   + ("met" if cpu_pct <= TARGET_CPU_PCT and rss_mb <= TARGET_RSS_MB else "NOT met")),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'agent overhead':<{width}}  value")
    print(f"{'-' * width}  {'-' * 40}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    write_report(__file__, {
        "source": source, "interval_s": args.interval, "wall_s": wall, "cpu_of_one_core_pct": cpu_pct,
        "cpu_user_pct": 100 * user / wall, "cpu_system_pct": 100 * system / wall, "rss_max_bytes": max(rss),
        "rss_last_bytes": rss[-1], "batches_count": batches, "samples_count": samples,
        "samples_per_s": samples / wall, "wire_gzip_bytes": sink.bytes,
        "target_met_ok": cpu_pct <= TARGET_CPU_PCT and rss_mb <= TARGET_RSS_MB})
    return 0


if __name__ == "__main__":
    sys.exit(main())
