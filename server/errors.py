"""Domain errors raised by services, and the one place that maps them to HTTP status codes.

Every error answer has one shape, RFC 9457 problem details (`application/problem+json`, `Problem` below):
`type`, `title`, `status`, `detail`, and our fields. Routes, the request guards (server/ratelimit.py), the gzip
middleware (server/inflate.py) and the ingest fast path all build it with `problem_body`/`problem_response`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_PREFIX = "urn:fleetprof:problem:"


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="where: `body`, `query` or `path`, then the field names")
    msg: str | None
    type: str | None


class Problem(BaseModel):
    """RFC 9457 problem details: the body of every error response (4xx and 5xx), served as
    `application/problem+json`. `detail` is a sentence, except for request validation errors (422), where it is the
    list of issues as before (clients read it); `errors` holds that list too."""

    type: str = Field(description=f"`{PROBLEM_TYPE_PREFIX}<kind>`, e.g. `{PROBLEM_TYPE_PREFIX}not-found`")
    title: str = Field(description="the HTTP status phrase")
    status: int = Field(description="the HTTP status code")
    detail: str | list[ValidationIssue] = Field(description="what went wrong, for people")
    errors: list[ValidationIssue] | None = Field(None, description="request validation errors (422 only)")
    retry_after_s: int | None = Field(None, description="with 429 and 503: seconds to wait, as Retry-After")


# The kind of problem by status, where the exception names none of its own.
_KIND_BY_STATUS = {400: "bad-request", 401: "unauthenticated", 403: "forbidden", 404: "not-found",
                   405: "method-not-allowed", 409: "conflict", 413: "payload-too-large", 415: "unsupported-media-type",
                   422: "invalid-input", 429: "rate-limited", 500: "internal-error", 503: "unavailable"}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(status: int, detail: Any, *, kind: str | None = None, headers: Mapping[str, str] | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The problem-details object for an error; `retry_after_s` is read from a Retry-After header."""
    body: dict[str, Any] = {"type": PROBLEM_TYPE_PREFIX + (kind or _KIND_BY_STATUS.get(status, f"http-{status}")),
                            "title": _phrase(status),
                            "status": status, "detail": detail, **extra}
    retry_after = next((v for k, v in (headers or {}).items() if k.lower() == "retry-after"), None)
    if retry_after is not None and retry_after.isdigit():
        body["retry_after_s"] = int(retry_after)
    return body


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def problem_response(status: int, detail: Any, *, kind: str | None = None, headers: Mapping[str, str] | None = None,
                     **extra: Any) -> JSONResponse:
    return ProblemResponse(problem_body(status, detail, kind=kind, headers=headers, **extra), status_code=status,
                           headers=headers)


PROBLEM_CONTENT = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}


def problem_openapi_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for FastAPI: these statuses answer a `Problem` (its schema is added to the document by
    server.app)."""
    return {status: {"description": _phrase(status), "content": PROBLEM_CONTENT} for status in statuses}


# Declared on every authenticated route (server.app; 429: the rate limit applies to every token); a route declares
# its own others (409, 413, 415, 503).
API_ERROR_RESPONSES = problem_openapi_responses(401, 403, 404, 422, 429)

# Seconds a client is asked to wait when the database is unreachable (restart, failover, pool exhausted).
DATABASE_RETRY_AFTER_S = 3


class DomainError(Exception):
    status_code = 400
    kind: str | None = None  # the problem type's last part; by status when None

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None):
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
    kind = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class TooManyRequests(DomainError):
    status_code = 429
    kind = "rate-limited"

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
    return problem_response(503, "database unavailable; retry later", kind="database-unavailable",
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
        return problem_response(exc.status_code, exc.message, kind=exc.kind, headers=headers)
    if isinstance(exc, HTTPException):
        # Raised by the request guard while a chunked body streams in (413): the ingest fast path calls this
        # outside FastAPI's routing, where it was a 500.
        return problem_response(exc.status_code, exc.detail, headers=exc.headers)
    if isinstance(exc, DATA_ERRORS) or (isinstance(exc, ValueError) and "NUL (0x00)" in str(exc)):
        # Input the database refuses to store (an integer past its column, NUL in text, a \u0000 in JSONB) is the
        # client's to fix: 422, found by fuzzing (tests/security/test_fuzz.py), never a 500. psycopg2 refuses
        # NUL characters with a bare ValueError, before the statement reaches Postgres.
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
        return problem_response(422, f"a value cannot be stored: {reason}", kind="unstorable-value")
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
        # `detail` stays the list it always was (clients read it); `errors` is the same list under its own name.
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
        return problem_response(422, errors, kind="validation-error", errors=errors)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI answers 400 when its json.loads raises anything but JSONDecodeError: RecursionError for a deeply
        # nested body, UnicodeDecodeError for bytes that are not UTF-8. Malformed JSON is 422 everywhere else.
        if exc.status_code == 400 and isinstance(exc.__cause__, (RecursionError, ValueError)):
            reason = "nested too deeply" if isinstance(exc.__cause__, RecursionError) else "not UTF-8 JSON"
            return problem_response(422, f"malformed JSON body: {reason}")
        # Routing's own answers come here too: 404 for an unknown path, 405 (with Allow) for a known one.
        return problem_response(exc.status_code, exc.detail, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        # Starlette's server-error middleware calls this for any unhandled exception, then re-raises it, so the
        # traceback is still logged; the client gets the problem shape and nothing of the traceback.
        return problem_response(500, "internal server error; the collector's log has the details")

    handled: tuple[type[Exception], ...] = (DomainError, sa_exc.DBAPIError, sa_exc.TimeoutError,
                                            *RAW_TRANSIENT_DB_ERRORS, *DATA_ERRORS, ValueError)
    for cls in handled:
        app.add_exception_handler(cls, _handle)
