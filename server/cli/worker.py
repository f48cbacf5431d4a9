"""`fleetprof worker`: a Celery worker on the Redis broker (cluster mode)."""

from __future__ import annotations

import argparse

from fleetprof.errors import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", "-c", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--beat", action="store_true", help="also run the periodic scheduler (one per cluster)")
    parser.add_argument("--loglevel", default="info")


def run(args: argparse.Namespace) -> int:
    from server.cli.schema import require_schema
    from server.config import get_settings
    from server.worker import create_celery_app

    settings = get_settings()
    if not settings.broker_url:
        raise CliError("FLEETPROF_BROKER_URL is not set; `fleetprof up` runs tasks in-process without a broker")
    require_schema(settings)
    app = create_celery_app(settings)
    argv = ["worker", "-Q", settings.queue_name, "-c", str(args.concurrency), f"--loglevel={args.loglevel}",
            "-n", f"fleetprof-%h-{settings.queue_name}"]
    if args.beat:
        argv += ["-B", "-s", str(settings.data_dir / "celerybeat-schedule")]
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.worker_main(argv)
    return 0
