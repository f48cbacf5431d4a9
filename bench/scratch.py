"""A throwaway Postgres database for a benchmark: created on the server of FLEETPROF_TEST_PG_ADMIN_URL (default:
the local Postgres, trust auth), dropped at the end whatever happens."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text

ADMIN_URL = os.environ.get("FLEETPROF_TEST_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """Yields the URL of a new database named `<prefix>_<pid>`; drops it (closing its connections) on exit."""
    name = f"{prefix}_{os.getpid()}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
