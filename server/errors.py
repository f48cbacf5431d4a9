"""Domain errors raised by services, and the one place that maps them to HTTP status codes."""

from __future__ import annotations

import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

# Seconds a client is asked to wait when the database is unreachable (restart, failover, pool exhausted).
DATABASE_RETRY_AFTER_S = 3


class DomainError(Exception):
    status_code = 400

    def __init__(self, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers


class NotAuthenticated(DomainError):
    status_code = 401


class Forbidden(DomainError):
    status_code = 403


class NotFound(DomainError):
    status_code = 404


class Conflict(DomainError):
    status_code = 409


class PayloadTooLarge(DomainError):
    status_code = 413


class InvalidInput(DomainError):
    status_code = 422


class UnsupportedMediaType(DomainError):
    status_code = 415


class Overloaded(DomainError):
    status_code = 503

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class TooManyRequests(DomainError):
    status_code = 429

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


def _raw_dbapi_transient() -> tuple[type[Exception], ...]:
    """DBAPI errors raised unwrapped: the ingest fast path runs SQL on the raw psycopg2 cursor."""
    classes: list[type[Exception]] = [sqlite3.OperationalError]  # embedded mode: "database is locked"
    try:
        import psycopg2

        classes += [psycopg2.OperationalError, psycopg2.InterfaceError]
    except ImportError:  # pragma: no cover - psycopg2 is a dependency of the server
        pass
    return tuple(classes)


RAW_TRANSIENT_DB_ERRORS = _raw_dbapi_transient()


def is_database_unavailable(exc: BaseException) -> bool:
    """A failure of the database *service* (down, restarting, connection lost, pool exhausted, deadlock or
    serialization failure), as opposed to a bug or bad data: worth a retry, so 503, not 500."""
    if isinstance(exc, sa_exc.DBAPIError):
        return exc.connection_invalidated or isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError))
    return isinstance(exc, (sa_exc.TimeoutError, *RAW_TRANSIENT_DB_ERRORS))


def database_unavailable_response(exc: BaseException) -> JSONResponse:
    # One line, no traceback: during an outage every request fails the same way.
    log.warning("database unavailable, answering 503: %s: %s", type(exc).__name__, str(exc).splitlines()[0]
                if str(exc) else "")
    return JSONResponse({"detail": "database unavailable; retry later"}, status_code=503,
                        headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})


def _raw_dbapi_data_errors() -> tuple[type[Exception], ...]:
    try:
        import psycopg2

        return (psycopg2.DataError,)
    except ImportError:  # pragma: no cover
        return ()


# Input the database refuses to store, raised by SQLAlchemy or (ingest's raw cursor) by psycopg2 itself.
DATA_ERRORS: tuple[type[Exception], ...] = (sa_exc.DataError, *_raw_dbapi_data_errors())


def error_response(exc: Exception) -> JSONResponse | None:
    """The answer to an exception a request raised; None when it is a bug (the caller lets it become a 500,
    whose path logs the traceback). The one mapping the app's handlers and the ingest fast path share."""
    if isinstance(exc, DomainError):
        headers = dict(exc.headers or {})
        if isinstance(exc, NotAuthenticated):
            headers.setdefault("WWW-Authenticate", "Bearer")
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code, headers=headers)
    if isinstance(exc, HTTPException):
        # Raised by the request guard while a chunked body streams in (413): the ingest fast path calls this
        # outside FastAPI's routing, where it was a 500.
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    if isinstance(exc, DATA_ERRORS) or (isinstance(exc, ValueError) and "NUL (0x00)" in str(exc)):
        # Input the database refuses to store (an integer past its column, NUL in text, a \u0000 in JSONB) is the
        # client's to fix: 422, found by fuzzing (tests/security/test_fuzz.py), never a 500. psycopg2 refuses
        # NUL characters with a bare ValueError, before the statement reaches Postgres.
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
        return JSONResponse({"detail": f"a value cannot be stored: {reason}"}, status_code=422)
    if is_database_unavailable(exc):
        return database_unavailable_response(exc)
    return None


def install_error_handlers(app: FastAPI) -> None:
    async def _handle(_: Request, exc: Exception) -> JSONResponse:
        response = error_response(exc)
        if response is None:
            raise exc  # a bug (IntegrityError, ProgrammingError...): the default 500 path logs the traceback
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Pydantic's error list, made JSON-safe (it can carry the offending float('nan') itself).
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        # FastAPI answers 400 when its json.loads raises anything but JSONDecodeError: RecursionError for a deeply
        # nested body, UnicodeDecodeError for bytes that are not UTF-8. Malformed JSON is 422 everywhere else.
        if exc.status_code == 400 and isinstance(exc.__cause__, (RecursionError, ValueError)):
            reason = "nested too deeply" if isinstance(exc.__cause__, RecursionError) else "not UTF-8 JSON"
            return JSONResponse({"detail": f"malformed JSON body: {reason}"}, status_code=422)
        return await http_exception_handler(request, exc)

    handled: tuple[type[Exception], ...] = (DomainError, sa_exc.DBAPIError, sa_exc.TimeoutError,
                                            *RAW_TRANSIENT_DB_ERRORS, *DATA_ERRORS, ValueError)
    for cls in handled:
        app.add_exception_handler(cls, _handle)
