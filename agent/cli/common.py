"""What every client command shares: finding the server and token, and turning transport errors into CLI errors."""

from __future__ import annotations

from agent.config import load_settings
from agent.transport import Transport
from fleetprof.errors import CliError
from fleetprof.jobid import job_id_problem


def client_transport(server_url: str | None = None, token: str | None = None, *, timeout_s: float = 60.0) -> Transport:
    settings = load_settings(server_url=server_url, token=token)
    if not settings.server_url:
        raise CliError("no server: set FLEETPROF_SERVER_URL (e.g. http://127.0.0.1:8000) or pass --server")
    if not settings.token:
        raise CliError("no token: set FLEETPROF_TOKEN (create one with `fleetprof token create`) or pass --token")
    return Transport(settings.server_url, settings.token, timeout_s=timeout_s)


def checked_job_id(value: str) -> str:
    """`value` if it is a job id (fleetprof/jobid.py), else a one-line error saying why, before any request."""
    problem = job_id_problem(value)
    if problem is not None:
        raise CliError(f"job id {value!r}: {problem}")
    return value


def add_server_arguments(parser) -> None:
    parser.add_argument("--server", help="collector URL (default: $FLEETPROF_SERVER_URL)")
    parser.add_argument("--token", help="API token (default: $FLEETPROF_TOKEN)")
