"""The one place that maps database failures to HTTP (server/errors.py), checked exception by exception.

The fault tests prove the behaviour end to end with a real Postgres going down; this pins which exceptions
count as "database unavailable" (503 + Retry-After) and which stay bugs (500).
"""

from __future__ import annotations

import sqlite3

import psycopg2
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import exc as sa_exc

from server.errors import DATABASE_RETRY_AFTER_S, install_error_handlers


def _app(error: BaseException) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    def boom() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


def _orig(cls: type[BaseException] = Exception) -> BaseException:
    return cls("server closed the connection unexpectedly")


UNAVAILABLE = [
    sa_exc.OperationalError("SELECT 1", {}, _orig(psycopg2.OperationalError)),
    sa_exc.InterfaceError("SELECT 1", {}, _orig(psycopg2.InterfaceError)),
    sa_exc.DBAPIError("SELECT 1", {}, _orig(), connection_invalidated=True),
    sa_exc.TimeoutError("QueuePool limit of size 20 overflow 10 reached"),
    psycopg2.OperationalError("could not connect to server: Connection refused"),  # raw cursor on the ingest path
    psycopg2.InterfaceError("connection already closed"),
    sqlite3.OperationalError("database is locked"),  # embedded mode
]
BUGS = [
    sa_exc.IntegrityError("INSERT", {}, _orig()),
    sa_exc.ProgrammingError("SELEC 1", {}, _orig()),
]  # (DataError, a value Postgres cannot store, is the client's: 422, see tests/security)


@pytest.mark.slow
@pytest.mark.parametrize("error", UNAVAILABLE, ids=lambda e: type(e).__module__.split(".")[0] + "." + type(e).__name__)
def test_database_unavailable_is_503_with_retry_after(error):
    r = _app(error).get("/boom")
    assert r.status_code == 503
    assert r.headers["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json() == {"type": "urn:fleetprof:problem:database-unavailable", "title": "Service Unavailable",
                        "status": 503, "detail": "database unavailable; retry later",
                        "retry_after_s": DATABASE_RETRY_AFTER_S}


@pytest.mark.slow
@pytest.mark.parametrize("error", BUGS, ids=lambda e: type(e).__name__)
def test_other_database_errors_stay_500(error):
    r = _app(error).get("/boom")
    assert r.status_code == 500
    assert "Retry-After" not in r.headers
    # The problem shape, and nothing of the exception (its text stays in the collector's log).
    assert r.json()["type"] == "urn:fleetprof:problem:internal-error" and "SELEC" not in r.text
