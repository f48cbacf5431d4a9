"""`fleetprof server`: the collector and REST API under uvicorn."""

from __future__ import annotations

import argparse

# Idle keep-alive connections are kept this long. uvicorn's default (5 s) equals the agent's batch interval, so the
# server closed a connection just as the agent sent its next batch on it ("Server disconnected without sending a
# response", a retry and a warning every few minutes); above the interval the connection is reused.
KEEP_ALIVE_S = 65


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (cluster mode)")
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    import faulthandler
    import signal

    import uvicorn

    from server.cli.schema import require_schema
    from server.config import get_settings

    require_schema(get_settings())  # bad settings or an unmigrated database: one line, exit 2, before uvicorn
    # `kill -USR1 <pid>` writes every thread's stack to stderr: how to see where a stuck request waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    uvicorn.run("server.app:create_app", factory=True, host=args.host, port=args.port, workers=args.workers,
                log_level=args.log_level, access_log=False, timeout_keep_alive=KEEP_ALIVE_S)
    return 0
