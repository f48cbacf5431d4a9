"""Engine and session factories. Built by the app's lifespan or the worker after fork, never at import."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from sqlalchemy import CursorResult, Engine, Result, create_engine, event, func, literal_column
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from server.config import ServerSettings

if TYPE_CHECKING:
    from psycopg2.extensions import connection as PgConnection


def make_engine(settings: ServerSettings) -> Engine:
    url = settings.sqlalchemy_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            # WAL lets the dashboard read while ingest writes; foreign keys are off by default in SQLite.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # No pre-ping: it costs a round trip per checkout on the ingest path. A connection broken by a database
    # restart raises a disconnect error, SQLAlchemy invalidates the pool, and the request answers 503.
    # Bounded waits everywhere: a connect that hangs, a peer that vanished (TCP keepalives notice within ~25 s),
    # a pool that is exhausted. No statement timeout: report and rollup queries may legitimately run long.
    return create_engine(url, pool_size=20, max_overflow=10, pool_recycle=1800, pool_timeout=10,
                         connect_args={"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 10,
                                       "keepalives_interval": 5, "keepalives_count": 3})


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work for tasks and CLI commands: commit on success, roll back on error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def is_postgres(engine_or_session: Engine | Session) -> bool:
    bind = engine_or_session.get_bind() if isinstance(engine_or_session, Session) else engine_or_session
    return bind.dialect.name == "postgresql"


def raw_connection(session: Session) -> PgConnection:
    """The DBAPI (psycopg2) connection under the session's transaction, for what SQLAlchemy does not do (COPY,
    EXPLAIN of a captured statement, array inserts). Postgres only."""
    dbapi = session.connection().connection.dbapi_connection
    if dbapi is None:  # a checked-out connection always has one; None only once it was invalidated
        raise RuntimeError("the session's database connection was invalidated")
    return cast("PgConnection", dbapi)


def rowcount(result: Result[Any]) -> int:
    """Rows an INSERT, UPDATE or DELETE touched. Session.execute types its answer as Result; for those
    statements it is a CursorResult, the one with rowcount."""
    return cast("CursorResult[Any]", result).rowcount


def dialect_insert(session: Session):
    """INSERT with ON CONFLICT for this session's dialect (Postgres or SQLite)."""
    return pg_insert if is_postgres(session) else sqlite_insert


def epoch_column(session: Session, column):
    """A timestamp column as float seconds since epoch, per dialect."""
    if is_postgres(session):
        return literal_column(f"extract(epoch from {column.name})::float8")
    return (func.julianday(column) - 2440587.5) * 86400.0


def float_rows(session: Session, stmt, ncols: int) -> np.ndarray:
    """The result of `stmt` (numeric or null columns) as a float64 array, null as NaN. Postgres: through
    COPY ... TO STDOUT and pandas' C parser (a 24 h x 1 Hz GPU series is 86,400 rows: building Python tuples for
    them cost ~10x more); SQLite: through rows."""
    if not is_postgres(session):
        rows = session.execute(stmt).all()
        return np.array(rows, dtype=np.float64) if rows else np.empty((0, ncols))
    import io

    import pandas as pd

    sql = str(stmt.compile(dialect=session.get_bind().dialect, compile_kwargs={"literal_binds": True}))
    buf = io.BytesIO()
    copy_sql = f"COPY ({sql}) TO STDOUT WITH (FORMAT csv)"
    with raw_connection(session).cursor() as cur:
        if hasattr(cur, "copy_expert"):  # psycopg2
            cur.copy_expert(copy_sql, buf)
        else:  # psycopg 3 (used when psycopg2 is not installed, see server.urls); typed as psycopg2's cursor
            pg3_cursor: Any = cur
            with pg3_cursor.copy(copy_sql) as copy:
                for chunk in copy:
                    buf.write(chunk)
    if buf.tell() == 0:
        return np.empty((0, ncols))
    buf.seek(0)
    return pd.read_csv(buf, header=None, dtype=np.float64, na_values=[""], keep_default_na=False).to_numpy()


_READERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleetprof-read")


def read_in_parallel(session: Session, read: Callable[..., Any], *args: Any) -> Future[Any]:
    """`read(session, *args)` on a session of its own in a thread (Postgres: independent reads of one request
    overlap, each on its own connection and backend), else now on this session (SQLite: one file, nothing to
    gain). The reads see committed data only, not this session's pending changes."""
    if not is_postgres(session):
        done: Future[Any] = Future()
        done.set_result(read(session, *args))
        return done

    def run() -> Any:
        with Session(bind=session.get_bind()) as own:
            return read(own, *args)

    return _READERS.submit(run)
