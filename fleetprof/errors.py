"""Errors shared by every CLI command, and the one table of the exit statuses they end with.

A script driving `fleetprof` tells from the status alone whether to fix its arguments (2), give up on a job that
does not exist (3), fix its token (4), retry later (5) or fix what it sent (6). `exit_code_for_status` maps an HTTP
status to its exit code; fleetprof/commands/common.py applies it to every API error of every client command.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 2  # bad arguments, a file that cannot be read, no server or token configured
    NOT_FOUND = 3  # HTTP 404: no such job, token or model (or not one this token may see)
    AUTH = 4  # HTTP 401/403: the token is wrong, revoked, or lacks the scope
    UNAVAILABLE = 5  # no answer (connection refused, timeout), 408, 429 or 5xx: worth retrying later
    REJECTED = 6  # any other HTTP 4xx: the server refused what was sent (413 too large, 422 invalid, 409 conflict)
    INTERRUPTED = 130  # Ctrl-C, like a shell


# The table the README and docs/cli.md show (tools/gendocs renders it from here).
EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.USAGE: "usage: bad arguments or options, a local file that cannot be read or parsed, no server or "
                    "token configured",
    ExitCode.NOT_FOUND: "not found (HTTP 404): the job, token or model does not exist, or is not this token's to see",
    ExitCode.AUTH: "not allowed (HTTP 401/403): wrong, expired or revoked token, or a scope that does not cover it",
    ExitCode.UNAVAILABLE: "server unavailable: connection refused, timeout, HTTP 408, 429 or 5xx (retry later)",
    ExitCode.REJECTED: "rejected (any other HTTP 4xx: 400, 409, 413, 422, ...): the server refused what was sent",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


class CliError(Exception):
    """A user-facing error: printed to stderr as one line without a traceback; the command exits with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE):
        super().__init__(message)
        self.code = code


def exit_code_for_status(status: int | None) -> ExitCode:
    """The exit code for an HTTP error status; None (no answer at all) is an unavailable server."""
    if status is None or status in (408, 429) or status >= 500:
        return ExitCode.UNAVAILABLE
    if status == 404:
        return ExitCode.NOT_FOUND
    if status in (401, 403):
        return ExitCode.AUTH
    return ExitCode.REJECTED
