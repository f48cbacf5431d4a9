"""What every client command shares: finding the server and token, and turning API errors into CLI errors with
the exit code of their HTTP status (fleetprof.errors)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from fleetprof.client import ApiError, Client
from fleetprof.errors import CliError, exit_code_for_status
from fleetprof.jobid import job_id_problem
from fleetprof.settings import ConnectionUnset, connection, load_client_settings


def api_failure(exc: ApiError, context: str | None = None) -> CliError:
    """The CLI error for a failed request: its message (prefixed with `context`) and the exit code its status
    maps to (no answer at all: server unavailable)."""
    return CliError(f"{context}: {exc}" if context else str(exc), exit_code_for_status(exc.status))


@contextmanager
def api_client(server_url: str | None = None, token: str | None = None, *,
               timeout_s: float = 60.0) -> Iterator[Client]:
    """A client of the configured server; an ApiError escaping the block becomes `api_failure`."""
    try:
        url, token = connection(load_client_settings(server_url=server_url, token=token))
    except ConnectionUnset as exc:
        raise CliError(f"{exc}, or pass {exc.option}") from None
    with Client(url, token, timeout_s=timeout_s) as client:
        try:
            yield client
        except ApiError as exc:
            raise api_failure(exc) from None


def checked_job_id(value: str) -> str:
    """`value` if it is a job id (fleetprof/jobid.py), else a one-line error saying why, before any request."""
    problem = job_id_problem(value)
    if problem is not None:
        raise CliError(f"job id {value!r}: {problem}")
    return value


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="collector URL (default: $FLEETPROF_SERVER_URL)")
    parser.add_argument("--token", help="API token (default: $FLEETPROF_TOKEN)")
