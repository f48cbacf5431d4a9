"""Listening sockets bound before anything says it is up: a port in use is one line, not a thread that dies.

werkzeug's `make_server` answers a port in use with `sys.exit(1)`, which in `fleetprof up`'s dashboard thread ended
only that thread: the banner still printed a dashboard link, carrying the operator token, to whatever held the port.
"""

from __future__ import annotations

import errno
import socket

from fleetprof.errors import CliError


def listen(host: str, port: int, what: str, option: str) -> socket.socket:
    """A socket listening on (host, port), or a CliError naming `what` and the `option` that picks another port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise CliError(f"the {what} could not start on {host}:{port}: {reason}; choose another with {option}") from None
