"""Query plans of the product's own statements (Postgres): capture what a code path sends, EXPLAIN it, and say
which partitions and indexes it touched.

Used by `bench/storage_plans.py` (figures at scale) and `tests/server/test_query_plans.py` (the regression
check). The statements are captured from the real code paths, never copied by hand, so a query that changes is
checked as it now is:

    with capture_statements(session) as captured:
        loader.load_job_data(session, job, settings, now=now)
    for stmt in captured:
        plan = explain(session, stmt, catalog=Catalog.load(session))

Two ways out of the code: what SQLAlchemy executes (a connection event), and the `COPY (SELECT …) TO STDOUT`
that bulk readers (`server.db.float_rows`) issue on the raw psycopg2 cursor, which SQLAlchemy never sees (a
recording cursor class on that connection while the capture lasts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.orm import Session

from server.db import raw_connection

_COPY = re.compile(r"^\s*COPY\s*\((?P<query>.*)\)\s*TO\s+STDOUT\b.*$", re.IGNORECASE | re.DOTALL)
INDEX_SCANS = frozenset({"Index Scan", "Index Only Scan", "Bitmap Heap Scan"})


@dataclass(frozen=True)
class Statement:
    """One statement as it went to the driver: SQL text, driver parameters (pyformat) or None."""

    sql: str
    params: Mapping[str, Any] | Sequence[Any] | None = None
    via_copy: bool = False

    @property
    def query(self) -> str:
        """The query EXPLAIN can take: the SELECT inside a COPY, else the statement itself."""
        if self.via_copy:
            m = _COPY.match(self.sql)
            if m is None:
                raise ValueError(f"not a COPY (query) TO STDOUT: {self.sql[:80]!r}")
            return m.group("query")
        return self.sql

    @property
    def is_read(self) -> bool:
        return self.query.lstrip().upper().startswith(("SELECT", "WITH"))


@contextmanager
def capture_statements(session: Session) -> Iterator[list[Statement]]:
    """Record every statement sent while the block runs (Postgres + psycopg2), COPYs included, on any connection of
    the session's engine (code under capture may read on sessions of its own, e.g. the fleet summary's parallel
    reads)."""
    import psycopg2.extensions
    import psycopg2.sql

    captured: list[Statement] = []
    conn = session.connection()  # the transaction's connection: the code under capture uses this one
    dbapi = conn.connection.dbapi_connection

    class RecordingCursor(psycopg2.extensions.cursor):
        def copy_expert(self, sql: str | bytes | psycopg2.sql.Composable, file: Any, size: int = 8192) -> None:
            sql_text = sql if isinstance(sql, str) else sql.decode() if isinstance(sql, bytes) else sql.as_string(self)
            captured.append(Statement(sql=sql_text, via_copy=True))
            return super().copy_expert(sql, file, size)

    def before_cursor_execute(_conn, _cursor, statement, parameters, _context, executemany):
        if not executemany:
            captured.append(Statement(sql=statement, params=parameters))

    recording: dict[int, tuple[Any, Any]] = {}  # id -> (DBAPI connection, its cursor factory before)

    def record(dbapi_conn: Any, *_: Any) -> None:
        if id(dbapi_conn) not in recording:
            recording[id(dbapi_conn)] = (dbapi_conn, dbapi_conn.cursor_factory)
            dbapi_conn.cursor_factory = RecordingCursor

    record(dbapi)
    engine = conn.engine
    event.listen(engine, "before_cursor_execute", before_cursor_execute)
    event.listen(engine.pool, "checkout", record)  # the connections of parallel reads
    try:
        yield captured
    finally:
        event.remove(engine.pool, "checkout", record)
        event.remove(engine, "before_cursor_execute", before_cursor_execute)
        for dbapi_conn, previous in recording.values():
            dbapi_conn.cursor_factory = previous


@dataclass(frozen=True)
class Catalog:
    """Which relations are partitions of which table, and which partition indexes belong to which table index
    (plans name the partition's own index, e.g. gpu_samples_p20261120_pkey; we report pk_gpu_samples)."""

    parent_of: Mapping[str, str]
    partitions: Mapping[str, frozenset[str]]

    @classmethod
    def load(cls, session: Session) -> Catalog:
        rows = session.execute(text(
            "SELECT c.relname, p.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema()")).all()
        parent_of = {child: parent for child, parent in rows}
        partitions: dict[str, set[str]] = {}
        for child, parent in rows:
            partitions.setdefault(parent, set()).add(child)
        return cls(parent_of=parent_of, partitions={p: frozenset(c) for p, c in partitions.items()})

    def root(self, name: str) -> str:
        while name in self.parent_of:
            name = self.parent_of[name]
        return name


@dataclass(frozen=True)
class Scan:
    """One scan node: the relation read (a partition or a plain table), the table it belongs to, how, with
    which (table-level) indexes and index conditions, and how often it ran (None without ANALYZE; 0 = pruned at
    run time). An index scan whose condition misses the index's leading column reads the whole index. `blocks`:
    shared blocks the node touched, its index included (None without ANALYZE, BUFFERS)."""

    relation: str
    table: str
    method: str
    indexes: tuple[str, ...]
    index_cond: str | None
    loops: int | None
    rows: float | None
    blocks: int | None

    @property
    def executed(self) -> bool:
        return self.loops is None or self.loops > 0

    @property
    def empty(self) -> bool:
        """Ran and read nothing: an empty partition (e.g. a day pre-created ahead), whatever the method."""
        return self.blocks == 0 and self.loops is not None and self.rows == 0


@dataclass(frozen=True)
class PlanSummary:
    scans: tuple[Scan, ...]
    execution_ms: float | None
    planning_ms: float | None
    shared_hit_blocks: int
    shared_read_blocks: int
    temp_blocks: int
    subplans_removed: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    def scans_of(self, table: str) -> list[Scan]:
        return [s for s in self.scans if s.table == table]

    def partitions_scanned(self, table: str) -> set[str]:
        """Partitions of `table` the plan read: present after plan-time pruning and not skipped at run time."""
        return {s.relation for s in self.scans_of(table) if s.executed and s.relation != table}


def _walk(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _walk(child)


def _bitmap_index_scans(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [n for n in _walk(node) if n.get("Node Type") == "Bitmap Index Scan"]


def summarize(plan_json: Sequence[Mapping[str, Any]] | Mapping[str, Any], catalog: Catalog) -> PlanSummary:
    """Scans, pruning and buffers from `EXPLAIN (FORMAT JSON[, ANALYZE, BUFFERS])` output."""
    doc = plan_json[0] if isinstance(plan_json, Sequence) else plan_json
    top = doc["Plan"]
    scans = []
    removed = 0
    for node in _walk(top):
        removed += int(node.get("Subplans Removed", 0))
        relation = node.get("Relation Name")
        if relation is None:
            continue
        kind = node["Node Type"]
        if kind == "Bitmap Heap Scan":
            index_nodes = _bitmap_index_scans(node)
        else:
            index_nodes = [node] if "Index Name" in node else []
        indexes = [n["Index Name"] for n in index_nodes]
        conds = [n["Index Cond"] for n in index_nodes if "Index Cond" in n]
        loops = node.get("Actual Loops")
        scans.append(Scan(relation=relation, table=catalog.root(relation), method=kind,
                          indexes=tuple(sorted({catalog.root(i) for i in indexes})),
                          index_cond=" AND ".join(conds) if conds else None,
                          loops=None if loops is None else int(loops),
                          rows=node.get("Actual Rows", node.get("Plan Rows")),
                          blocks=(int(node["Shared Hit Blocks"]) + int(node.get("Shared Read Blocks", 0))
                                  if "Shared Hit Blocks" in node else None)))
    return PlanSummary(
        scans=tuple(scans), execution_ms=doc.get("Execution Time"), planning_ms=doc.get("Planning Time"),
        shared_hit_blocks=int(top.get("Shared Hit Blocks", 0)),
        shared_read_blocks=int(top.get("Shared Read Blocks", 0)),
        temp_blocks=int(top.get("Temp Read Blocks", 0)) + int(top.get("Temp Written Blocks", 0)),
        subplans_removed=removed, raw=dict(doc))


def explain(session: Session, statement: Statement, *, catalog: Catalog, analyze: bool = True) -> PlanSummary:
    """EXPLAIN the statement exactly as it was sent (same text, same driver parameters). With `analyze` the
    query runs again: only reads are accepted."""
    if not statement.is_read:
        raise ValueError(f"only reads are explained: {statement.sql[:80]!r}")
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with raw_connection(session).cursor() as cur:
        cur.execute(f"EXPLAIN ({options}) {statement.query}", statement.params)
        row = cur.fetchone()
    if row is None:  # EXPLAIN answers one row; a driver that gave none is not one this code knows
        raise RuntimeError("EXPLAIN returned no row")
    (doc,) = row
    return summarize(json.loads(doc) if isinstance(doc, str) else doc, catalog)
