"""One transaction on the configured database for an operator command (`fleetprof token`, `fleetprof models`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from fleetprof.errors import CliError, ExitCode

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

T = TypeVar("T")


def in_session(work: Callable[[Session], T]) -> T:
    """`work(session)` in one transaction on the configured database (the embedded one migrated first); a domain
    error becomes a one-line CLI error."""
    from server.cli.schema import require_schema
    from server.config import get_settings
    from server.db import make_engine, make_sessionmaker, session_scope
    from server.errors import DomainError, NotFound
    from server.migrate import upgrade

    settings = get_settings()
    if settings.embedded:
        upgrade(settings)
    require_schema(settings)  # an unmigrated database: one line saying `fleetprof db upgrade`, not a traceback
    engine = make_engine(settings)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            return work(session)
    except DomainError as exc:  # the arguments named something that is not there (exit 3), or were refused (2)
        raise CliError(exc.message, ExitCode.NOT_FOUND if isinstance(exc, NotFound) else ExitCode.USAGE) from None
    finally:
        engine.dispose()
