"""Bulk writes of time-series rows, de-duplicated on the table's primary key.

Postgres: COPY into a per-connection temporary staging table (timestamps as float8 epoch seconds, so no
datetime formatting on the hot path), then one `INSERT ... SELECT ... ON CONFLICT DO NOTHING`.
SQLite (embedded mode): `INSERT OR IGNORE` with executemany.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import datetime, timezone

from sqlalchemy import Table, insert
from sqlalchemy.dialects import postgresql as _pg_dialect
from sqlalchemy.orm import Session

from server.db import is_postgres

NULL = "\\N"
_PG = _pg_dialect.dialect()


def _copy_text(columns: Sequence[Sequence[object]]) -> str:
    """COPY text format, column-wise: each column is formatted in one comprehension, then rows are zipped."""
    formatted = []
    for col in columns:
        formatted.append([NULL if v is None else ("t" if v is True else "f" if v is False else repr(v)
                                                   if isinstance(v, float) else str(v)) for v in col])
    return "".join("\t".join(row) + "\n" for row in zip(*formatted))


def _staging_name(table: Table) -> str:
    return f"_stage_{table.name}"


def _ensure_staging(cursor, table: Table, time_columns: frozenset[str]) -> None:  # type: ignore[no-untyped-def]
    cols = ", ".join(
        f"{c.name} double precision" if c.name in time_columns else f"{c.name} {c.type.compile(dialect=_PG)}"
        for c in table.columns
    )
    # ON COMMIT DELETE ROWS: the staging table is empty at the start of every transaction.
    cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_staging_name(table)} ({cols}) ON COMMIT DELETE ROWS")




def insert_ignore(session: Session, table: Table, names: Sequence[str], columns: Sequence[Sequence[object]],
                  *, time_columns: frozenset[str] = frozenset({"ts"})) -> int:
    """Insert column-wise data; rows whose primary key exists are skipped. Returns rows inserted.

    `columns[i]` holds the values of `names[i]`; time columns hold float epoch seconds.
    """
    n = len(columns[0]) if columns else 0
    if n == 0:
        return 0
    if is_postgres(session):
        dbapi_conn = session.connection().connection.dbapi_connection
        with dbapi_conn.cursor() as cur:
            _ensure_staging(cur, table, time_columns)
            col_list = ", ".join(names)
            cur.copy_expert(f"COPY {_staging_name(table)} ({col_list}) FROM STDIN", io.StringIO(_copy_text(columns)))
            select_list = ", ".join(f"to_timestamp({c})" if c in time_columns else c for c in names)
            cur.execute(
                f"INSERT INTO {table.name} ({col_list}) SELECT {select_list} FROM {_staging_name(table)} "
                f"ON CONFLICT DO NOTHING"
            )
            inserted = cur.rowcount
            # Empty it now too, in case the same transaction stages this table again.
            cur.execute(f"TRUNCATE {_staging_name(table)}")
        return inserted
    rows = []
    converted = [
        [None if v is None else datetime.fromtimestamp(v, timezone.utc) for v in col] if name in time_columns
        else col
        for name, col in zip(names, columns)
    ]
    for values in zip(*converted):
        rows.append(dict(zip(names, values)))
    result = session.execute(insert(table).prefix_with("OR IGNORE"), rows)
    return result.rowcount if result.rowcount is not None and result.rowcount >= 0 else n
