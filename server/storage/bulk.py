"""Bulk writes of time-series rows, de-duplicated on the table's primary key.

Postgres: rows whose columns are all fixed-size (GPU samples) go in one binary COPY per table and group
(server/storage/pgcopy.py), others (process samples, with text columns) in one `INSERT ... SELECT ... FROM
unnest(typed arrays)`; neither checks for conflicts. The rare group that meets a row already stored is rolled
back to a savepoint and redone with `INSERT ... ON CONFLICT DO NOTHING`. Measured per row into the partitioned
sample table (docs/ARCHITECTURE.md, "Ingest path"): binary COPY ~2.4 us, unnest INSERT ~5.4 us, unnest INSERT
ON CONFLICT ~12 us; COPY from Python-formatted text cost ~9 us of Python alone.
SQLite (embedded mode): `INSERT OR IGNORE` with executemany.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import cast

import orjson
import psycopg2.errors
from sqlalchemy import Table, insert
from sqlalchemy.dialects import postgresql as _pg_dialect
from sqlalchemy.orm import Session

from server.db import is_postgres, raw_connection, rowcount
from server.models.base import from_epoch
from server.storage import pgcopy
from server.storage.partitions import PARTITIONED_TABLES, PARTITIONS, day_of

_PG = _pg_dialect.dialect()


def _pg_array_type(column, name: str, time_columns: frozenset[str]) -> str:
    if name in time_columns:
        return "float8[]"
    return column.type.compile(dialect=_PG).split("(")[0].lower() + "[]"


def _array_literal(col: Sequence[object]) -> str:
    """A Postgres array literal from a list of numbers, booleans, None or strings (JSON syntax is close:
    brackets become braces; null, true and false are spelled alike; strings are double-quoted the same way
    except for escapes, which Postgres reads compatibly for the characters our validated names allow)."""
    text = orjson.dumps(col).decode()
    return "{" + text[1:-1] + "}"


def _pg_type(column, name: str, time_columns: frozenset[str]) -> str:
    return "timestamptz" if name in time_columns else column.type.compile(dialect=_PG).split("(")[0].lower()


def _copy_or_insert(cur, table: Table, names: Sequence[str], columns: Sequence[Sequence[object]],
                    time_columns: frozenset[str]) -> int:
    """Binary COPY when every column is fixed-size (samples), else a plain INSERT ... SELECT FROM unnest."""
    try:
        payload = pgcopy.encode([_pg_type(table.c[name], name, time_columns) for name in names], columns)
    except pgcopy.NotEncodable:
        return _insert_select(cur, table, names, columns, time_columns, on_conflict_do_nothing=False)
    cur.copy_expert(f"COPY {table.name} ({', '.join(names)}) FROM STDIN (FORMAT binary)", io.BytesIO(payload))
    return cur.rowcount


def _insert_select(cur, table: Table, names: Sequence[str], columns: Sequence[Sequence[object]],
                   time_columns: frozenset[str], *, on_conflict_do_nothing: bool) -> int:
    # Each column travels as one typed array literal ('{1.5,null,2}': orjson writes the list, in C) and
    # Postgres zips them with unnest: one set-based statement, no per-value formatting in Python.
    params = {f"a{i}": _array_literal(col) for i, col in enumerate(columns)}
    arrays = ", ".join(f"%(a{i})s::{_pg_array_type(table.c[name], name, time_columns)}"
                       for i, name in enumerate(names))
    refs = [f"c{i}" for i in range(len(names))]
    select_list = ", ".join(f"to_timestamp({ref})" if name in time_columns else ref
                            for name, ref in zip(names, refs, strict=True))
    sql = (f"INSERT INTO {table.name} ({', '.join(names)}) SELECT {select_list} "
           f"FROM unnest({arrays}) AS r({', '.join(refs)})")
    cur.execute(sql + (" ON CONFLICT DO NOTHING" if on_conflict_do_nothing else ""), params)
    return cur.rowcount


def insert_ignore(session: Session, table: Table, names: Sequence[str], columns: Sequence[Sequence[object]],
                  *, time_columns: frozenset[str] = frozenset({"ts"})) -> int:
    """Insert column-wise data; rows whose primary key exists are skipped. Returns rows inserted.

    `columns[i]` holds the values of `names[i]`; time columns hold float epoch seconds.
    """
    n = len(columns[0]) if columns else 0
    if n == 0:
        return 0
    if is_postgres(session):
        if table.name in PARTITIONED_TABLES:
            days = {day_of(t) for t in columns[list(names).index("ts")]}  # type: ignore[arg-type]
            PARTITIONS.ensure(session, days, tables=(table.name,))
        with raw_connection(session).cursor() as cur:
            # The fast path writes without any conflict check (binary COPY, else a plain INSERT): rows already
            # stored are rare (an agent that lost its sequence state; resent batches are caught by their batch
            # key before this). When it meets one, it is undone to the savepoint and the group is redone
            # skipping the existing rows.
            cur.execute("SAVEPOINT fleetprof_bulk_insert")
            try:
                inserted = _copy_or_insert(cur, table, names, columns, time_columns)
            except psycopg2.errors.UniqueViolation:
                cur.execute("ROLLBACK TO SAVEPOINT fleetprof_bulk_insert")
                inserted = _insert_select(cur, table, names, columns, time_columns, on_conflict_do_nothing=True)
            cur.execute("RELEASE SAVEPOINT fleetprof_bulk_insert")
            return inserted
    rows = []
    converted = [
        # from_epoch: rounded as Postgres rounds, and as every other timestamp (job windows) is converted
        [from_epoch(cast("float | None", v)) for v in col] if name in time_columns  # epoch seconds or null
        else col
        for name, col in zip(names, columns, strict=True)
    ]
    for values in zip(*converted, strict=True):
        rows.append(dict(zip(names, values, strict=True)))
    result = session.execute(insert(table).prefix_with("OR IGNORE"), rows)
    inserted = rowcount(result)
    return inserted if inserted is not None and inserted >= 0 else n
