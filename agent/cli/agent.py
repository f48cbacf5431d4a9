"""`fleetprof agent`: run the node agent in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from agent.config import load_settings
from agent.devices.base import DeviceUnavailableError
from fleetprof.errors import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", metavar="URL", help="collector URL (default: FLEETPROF_SERVER_URL)")
    parser.add_argument("--token", help="agent-scope API token (default: FLEETPROF_TOKEN)")
    parser.add_argument("--interval", type=float, metavar="SECONDS",
                        help="sampling interval (default: FLEETPROF_INTERVAL_S or 1)")
    parser.add_argument("--source", metavar="nvml|replay:FILE|replay-original:FILE",
                        help="where samples come from (default: FLEETPROF_SOURCE or nvml). nvml: this node's GPUs. "
                             "replay:FILE: a recording (nvidia-smi CSV log or fleetprof .jsonl, e.g. a spool "
                             "segment) played as if live: samples get this agent's clock and its per-interval "
                             "mean/max, and the file loops. replay-original:FILE: the recording's own "
                             "timestamps and values, one sample per recorded row, verbatim, one recorded "
                             "timestep per --interval, once; the agent keeps shipping after the end until "
                             "stopped. fake:N: N simulated GPUs (benchmark)")
    parser.add_argument("--spool", type=Path, metavar="DIR", help="spool directory (default: FLEETPROF_SPOOL_DIR)")
    parser.add_argument("--node", metavar="NAME", help="node name (default: FLEETPROF_NODE_NAME or the hostname)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve this node's GPU gauges for Prometheus at http://HOST:PORT/metrics, under "
                             "dcgm-exporter's names and labels (default: FLEETPROF_AGENT_METRICS_PORT; unset: off)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def run(args: argparse.Namespace) -> int:
    from agent.daemon import MetricsPortError, SourceError, run_agent
    from agent.spool import SpoolError

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per shipped batch; failures log on their own
    settings = load_settings(server_url=args.server, token=args.token, interval_s=args.interval,
                             spool_dir=args.spool, node_name=args.node, source=args.source,
                             agent_metrics_port=args.metrics_port)
    if not settings.server_url:
        raise CliError("no collector URL: pass --server URL or set FLEETPROF_SERVER_URL")
    if settings.interval_s <= 0:
        raise CliError("--interval must be positive")
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        logging.getLogger(__name__).info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        run_agent(settings, source=settings.source, stop=stop)
    except (SourceError, DeviceUnavailableError, SpoolError, MetricsPortError) as exc:
        raise CliError(str(exc)) from None
    return 0
