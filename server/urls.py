"""Database and broker URLs as people write them, turned into the one form the server uses.

`postgresql://user@host/db` is what most people (and most hosted Postgres consoles) write; SQLAlchemy 2.1 reads
it as psycopg 3, which the server extra does not install (a 36-line `No module named 'psycopg'`). Every Postgres
form is therefore mapped to a driver that is installed: psycopg2 first (the server extra installs
psycopg2-binary and every database path is tested with it), else psycopg 3; the driver a URL names only says
"Postgres". Settings validation calls these functions, so the server, the worker, the migrations,
`fleetprof db` and `fleetprof up` all see the same URL. Messages name the scheme only, never the URL: it may
carry a password.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg")
SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")
BROKER_SCHEMES = ("redis", "rediss")
# The import name of each driver, best first.
POSTGRES_DRIVERS = (("psycopg2", "psycopg2"), ("psycopg", "psycopg"))

DATABASE_FORMS = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (also postgres://, postgresql+psycopg2://, " \
                 "postgresql+psycopg://) or sqlite:///PATH"
BROKER_FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB] or rediss:// (TLS)"


class UnsupportedURL(ValueError):
    """A URL the server cannot use; the message is one line that says what it accepts."""


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _split(url: str, forms: str) -> tuple[str, str]:
    scheme, sep, rest = url.strip().partition("://")
    if not sep or not scheme:
        raise UnsupportedURL(f"not a URL (no scheme://); accepted forms: {forms}")
    return scheme.lower(), rest


def database_url(url: str, installed: Callable[[str], bool] = _installed) -> str:
    """The SQLAlchemy URL for a database URL in any accepted form (`installed(module)` says which drivers are)."""
    scheme, rest = _split(url, DATABASE_FORMS)
    if scheme in SQLITE_SCHEMES:
        return f"sqlite://{rest}"
    if scheme not in POSTGRES_SCHEMES:
        raise UnsupportedURL(f"unsupported database URL scheme '{scheme}://'; accepted forms: {DATABASE_FORMS}")
    for driver, module in POSTGRES_DRIVERS:
        if installed(module):
            return f"postgresql+{driver}://{rest}"
    raise UnsupportedURL("no PostgreSQL driver is installed: pip install psycopg2-binary (the server extra has it)")


def broker_url(url: str) -> str:
    """The broker URL (Redis, for Celery and the server's own queue reads) with its scheme checked."""
    scheme, rest = _split(url, BROKER_FORMS)
    if scheme not in BROKER_SCHEMES:
        raise UnsupportedURL(f"unsupported broker URL scheme '{scheme}://'; accepted forms: {BROKER_FORMS}")
    return f"{scheme}://{rest}"
