"""Alembic, driven from code: `fleetprof db upgrade`, the app's embedded start-up and the tests all use this."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from server.config import ServerSettings

# `migrations` is a package of the distribution, so a plain (non-editable) install can migrate too.
_spec = importlib.util.find_spec("migrations")
MIGRATIONS_DIR = (Path(_spec.origin).parent if _spec and _spec.origin
                  else Path(__file__).resolve().parents[1] / "migrations")


def alembic_config(settings: ServerSettings) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' must be escaped for ConfigParser interpolation (passwords in URLs).
    cfg.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    return cfg


def upgrade(settings: ServerSettings, revision: str = "head") -> None:
    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), revision)


def downgrade(settings: ServerSettings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)


UPGRADE_HINT = "run `fleetprof db upgrade`"


@dataclass(frozen=True)
class SchemaState:
    """Where a database's schema stands against this code's migrations."""

    revision: str | None  # None: never migrated
    head: str
    known: bool           # False: a revision this code does not know (a newer release migrated it)

    @property
    def ready(self) -> bool:
        """At head, or past it: in a rolling upgrade the new release migrates first and the old one keeps serving."""
        return self.revision == self.head or (self.revision is not None and not self.known)

    @property
    def summary(self) -> str:
        """One line: what is wrong and what to run, or where the schema stands."""
        if self.revision is None:
            return f"the database has no fleetprof schema (never migrated): {UPGRADE_HINT}"
        if not self.ready:
            return f"the database schema is at revision {self.revision}, this code needs {self.head}: {UPGRADE_HINT}"
        if not self.known:
            return f"ok (schema revision {self.revision} is newer than this fleetprof's {self.head})"
        return "ok"


@lru_cache(maxsize=1)
def _revisions() -> tuple[str, frozenset[str]]:
    """This code's head and every revision it knows (parsed once: the migration files do not change at run time)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(cfg)
    return script.get_current_head() or "base", frozenset(s.revision for s in script.walk_revisions())


def schema_state(conn: Connection) -> SchemaState:
    revision = MigrationContext.configure(conn).get_current_revision()
    head, known = _revisions()
    return SchemaState(revision=revision, head=head, known=revision is None or revision in known)


def reachable_schema_state(engine: Engine) -> SchemaState | None:
    """The schema state, or None when the database does not answer (a server may start and wait for it)."""
    try:
        with engine.connect() as conn:
            return schema_state(conn)
    except DBAPIError:
        return None
