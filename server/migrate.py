"""Alembic, driven from code: `fleetprof db upgrade`, the app's embedded start-up and the tests all use this."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config

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
