"""The schema check the server-side commands run before they start: one line instead of a 500 per request."""

from __future__ import annotations

import logging

from fleetprof.errors import CliError
from server.config import ServerSettings
from server.db import make_engine
from server.migrate import reachable_schema_state

log = logging.getLogger(__name__)


def require_schema(settings: ServerSettings) -> None:
    """Refuse a database that answers but was never migrated (or is behind this code). The embedded database
    migrates itself; one that does not answer yet is left to /readyz (a collector may start before Postgres)."""
    if settings.embedded:
        return
    engine = make_engine(settings)
    try:
        state = reachable_schema_state(engine)
    finally:
        engine.dispose()
    if state is None:
        log.warning("the database does not answer yet; /readyz says not ready until it does")
    elif not state.ready:
        raise CliError(state.summary)
