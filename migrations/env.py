"""Alembic environment: the URL comes from server.migrate.alembic_config, the schema from server.models."""

from __future__ import annotations

import re

from alembic import context
from sqlalchemy import create_engine, pool

from server.models import Base

config = context.config
target_metadata = Base.metadata
PARTITION = re.compile(r"_p\d{8}$")


def include_name(name, type_, parent_names):
    """Daily partitions (created at run time by server/storage/partitions.py) are not part of the schema."""
    return not (type_ == "table" and name and PARTITION.search(name))


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:  # server/migrate.py sets it from the server's settings
        raise RuntimeError("sqlalchemy.url is not set in the Alembic config")
    return url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds tables there.
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite", compare_type=True,
                          include_name=include_name)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
