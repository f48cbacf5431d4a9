"""`fleetprof up`: the whole product on one machine.

Embedded default (no FLEETPROF_DATABASE_URL): SQLite under ./.fleetprof/, tasks in-process. With
FLEETPROF_DATABASE_URL / FLEETPROF_BROKER_URL set, the same code runs on Postgres + Redis + Celery (start
`fleetprof worker --beat` beside it). Starts the collector, the dashboard, a local agent (real NVML when a GPU is
present, else a labelled replay of recorded real telemetry) and the periodic sweeps; Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import server.demo
from fleetprof.client import Client
from fleetprof.errors import CliError
from fleetprof.ports import listen
from fleetprof.recordings import read_recording

log = logging.getLogger("fleetprof.up")

# uvicorn waits this long for open requests on shutdown, then cancels them (so the app's lifespan shutdown, which
# cancels queued characterizations, always runs)
GRACEFUL_SHUTDOWN_S = 5

# Real telemetry recorded on a real GPU, replayed when this machine has none: the nvidia-smi capture of an
# H100 under load (idle row, then gpu_burn + memhogs), shipped in the server.demo package (see its README).
DEMO_RECORDING = Path(server.demo.__file__).resolve().parent / "nvidia-smi-h100-capture.txt"
DEMO_NODE = "local-replay"
DEMO_JOB = "demo-replay"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address for API and dashboard")
    parser.add_argument("--port", type=int, default=8000, help="collector/API port (default 8000)")
    parser.add_argument("--dashboard-port", type=int, default=8050, help="dashboard port (default 8050)")
    parser.add_argument("--no-agent", action="store_true", help="do not start a local agent")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    parser.add_argument("--source", default=None,
                        help="agent source: nvml, or replay:FILE (default: nvml if a GPU is present, else a replay)")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: all mean "replay"
        return False


def _periodic(stop: threading.Event, settings) -> None:
    """Embedded mode's beat: rollups and due characterizations, in-process."""
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.fleet.service import RECENT_HOURS, backlog_spans, rollup_hours
    from server.jobs.report_store import characterize_job_pk
    from server.jobs.sweep import jobs_due
    from server.jobs.unseen import end_unseen_jobs
    from server.storage.partitions import apply_retention

    engine = make_engine(settings)
    factory = make_sessionmaker(engine)
    last_retention = 0.0
    while not stop.wait(min(30.0, settings.characterize_running_every_s)):
        try:
            now = time.time()
            with session_scope(factory) as session:
                rollup_hours(session, since=now - RECENT_HOURS * 3600, until=now)
                for k, first, last in backlog_spans(session, now=now, raw_retention_days=settings.raw_retention_days):
                    rollup_hours(session, since=first, until=last, now=now, ranges=[k])
                if now - last_retention > 3600:
                    apply_retention(session, now=now, raw_retention_days=settings.raw_retention_days)
                    last_retention = now
                end_unseen_jobs(session, timeout_s=settings.job_unseen_timeout_s)
                due = jobs_due(session, every_s=settings.characterize_running_every_s)
            for job_pk in due:
                characterize_job_pk(factory, job_pk, settings)
        except Exception:  # noqa: BLE001 - a failed sweep is retried at the next tick
            log.exception("periodic sweep failed")
    engine.dispose()


def _register_demo_job(base_url: str, token: str, recording: Path) -> None:
    rec = read_recording(recording)
    with Client(base_url, token) as api:
        api.register_job({"job_id": DEMO_JOB, "team": "demo", "state": "running", "started_at": time.time(),
                          "name": f"replay of {recording.name} (recorded real telemetry, not live)",
                          "node": DEMO_NODE, "gpu_uuids": [g.uuid for g in rec.gpus], "metadata": {"replay": True}})


def _dashboard_server() -> Callable[..., None] | None:
    """dashboard.server.serve_dashboard, or None where the dashboard extra is not installed."""
    try:
        from dashboard.server import serve_dashboard
    except ImportError:
        return None
    return serve_dashboard


def _wait_started(server, thread: threading.Thread, url: str, timeout_s: float = 60.0) -> None:
    """Wait until OUR uvicorn bound its port (another process answering on it does not count)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.started:
            return
        if not thread.is_alive():
            raise CliError(f"the collector could not start on {url} (is the port already in use? "
                           f"choose another with --port)")
        time.sleep(0.1)
    raise CliError(f"the collector did not start on {url} within {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app
    from server.cli.serve import KEEP_ALIVE_S
    from server.cli.token import create_token_now
    from server.config import get_settings
    from server.migrate import upgrade

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # What a newcomer should read is the banner below, not each migration's docstring or a line per request
    # the local agent and dashboard make every few seconds.
    for noisy in ("alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = get_settings()
    # Both ports are bound before anything starts or prints: one in use is one line (exit 2), never a banner whose
    # dashboard link, operator token included, points at whatever holds the port.
    serve_dashboard = None if args.no_dashboard else _dashboard_server()
    api_sock = listen(args.host, args.port, "collector", "--port")
    try:
        dashboard_sock = (listen(args.host, args.dashboard_port, "dashboard", "--dashboard-port")
                          if serve_dashboard is not None else None)
    except CliError:
        api_sock.close()
        raise
    upgrade(settings)
    operator_token = create_token_now("operator", description="fleetprof up")
    agent_token = create_token_now("agent", node="*", description="fleetprof up local agent")
    base_url = f"http://{args.host}:{args.port}"

    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=args.host, port=args.port, log_level="warning",
                                           access_log=False, timeout_keep_alive=KEEP_ALIVE_S,
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(target, *a, name: str) -> None:
        t = threading.Thread(target=target, args=a, name=name, daemon=True)
        t.start()
        threads.append(t)

    server_thread = threading.Thread(target=server.run, kwargs={"sockets": [api_sock]}, name="collector", daemon=True)
    server_thread.start()
    _wait_started(server, server_thread, base_url)
    if settings.embedded:
        start(_periodic, stop, settings, name="periodic")

    storage = f"embedded: SQLite under {settings.data_dir}" if settings.embedded else "postgres"
    lines = [f"fleetprof is up ({storage})", f"  API:        {base_url}   (OpenAPI docs: {base_url}/docs)"]
    if serve_dashboard is not None:
        start(serve_dashboard, args.host, args.dashboard_port, base_url, operator_token, stop, dashboard_sock,
              name="dashboard")
        lines.append(f"  dashboard:  http://{args.host}:{args.dashboard_port}/?token={operator_token}")
    elif not args.no_dashboard:
        lines.append("  dashboard:  not available in this install")
    if not args.no_agent:
        source = args.source or ("nvml" if _gpu_present() else f"replay:{DEMO_RECORDING}")
        kind, _, replay_file = source.partition(":")
        is_replay = kind in ("replay", "replay-original")
        try:
            from agent.config import load_settings
            from agent.daemon import run_agent
        except ImportError:
            lines.append("  agent:      not available in this install")
        else:
            agent_settings = load_settings(server_url=base_url, token=agent_token,
                                           spool_dir=settings.data_dir / "spool",
                                           node_name=DEMO_NODE if is_replay else None,
                                           replay_job_id=DEMO_JOB if kind == "replay" else None)
            if is_replay:
                _register_demo_job(base_url, operator_token, Path(replay_file))
                lines.append(f"  agent:      REPLAY of recorded real telemetry ({replay_file}), node {DEMO_NODE!r} "
                             f"— not live NVML")
            else:
                lines.append("  agent:      live NVML on this machine")
            start(lambda: run_agent(agent_settings, source=source, stop=stop), name="agent")
    lines.append(f"  operator token: {operator_token}")
    # Ctrl-C (SIGINT) and a service manager's SIGTERM both stop it in order, from the moment the banner says it is
    # up. Set here rather than left to Python: a process started from a non-interactive shell's background job
    # inherits SIGINT ignored, which Python keeps.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print("\n".join(lines), flush=True)
        while server_thread.is_alive():
            server_thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.should_exit = True
        # One 15 s budget for all of them, not 15 s each (the threads are daemons).
        deadline = time.monotonic() + 15
        for t in [*threads, server_thread]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
    left = [t.name for t in [*threads, server_thread] if t.is_alive()]
    if left:
        # The interpreter's teardown would join the server's worker pools, one of them mid-task: leave now, since
        # everything durable is committed and reports are recomputed on the next start.
        print(f"fleetprof stopped (still running after 15 s, cut short: {', '.join(left)})", flush=True)
        logging.shutdown()
        os._exit(0)
    print("fleetprof stopped", flush=True)
    return 0
