"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import uuid as _uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = REPO_ROOT / "tests" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs `pytest -n 2`), the tests marked `slow` go first, in their collected
    order: a worker that picks one of them up early leaves the other to drain the many quick ones, instead of
    both idling while one runs a fuzz test at the very end. A plain `pytest` keeps the collected order.
    Every worker collects alike, so the order is the same on all of them, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: ties keep their order


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real data in tests/data (Kineto traces, nvidia-smi captures, energy, cluster series; SOURCES.md there)."""
    return REAL_DATA


# ------------------------------------------------------------------ real Postgres and Redis, per test session

PG_ADMIN_URL = os.environ.get("FLEETPROF_TEST_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("FLEETPROF_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SESSION_TAG = f"{os.getpid()}_{_uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def pg_url():
    """A database of this test session's own, migrated with the real Alembic migrations; dropped at the end."""
    from sqlalchemy import create_engine, text

    from server.config import ServerSettings
    from server.migrate import upgrade

    name = f"fleetprof_test_{SESSION_TAG}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    upgrade(ServerSettings(database_url=url))
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def pg_engine(pg_url):
    from sqlalchemy import create_engine

    engine = create_engine(pg_url)
    yield engine
    engine.dispose()


def _truncate_all(engine) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    from server.models import Base

    names = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


@pytest.fixture
def clean_db(pg_engine):
    """Every test starts from empty tables (the tests commit through the real request boundary)."""
    _truncate_all(pg_engine)
    yield pg_engine


_queue_numbers = iter(range(1, 1_000_000))


@pytest.fixture
def server_settings(pg_url, clean_db, tmp_path):
    """Each test its own Celery queue (and so its own Redis keys: the queue name prefixes them all), so nothing one
    test queued or recorded (tasks left waiting, a worker's task durations) is seen by the next test in the same
    session, whatever order pytest-xdist runs them in."""
    from server.config import ServerSettings

    return ServerSettings(database_url=pg_url, broker_url=None, data_dir=tmp_path / "fleetprof",
                          queue_name=f"fleetprof_test_{SESSION_TAG}_{next(_queue_numbers)}")


@pytest.fixture
def db_session(server_settings):
    from server.db import make_engine, make_sessionmaker

    engine = make_engine(server_settings)
    session = make_sessionmaker(engine)()
    yield session
    session.close()
    engine.dispose()


@pytest.fixture
def make_token(server_settings):
    """make_token(scope, team=None, node=None) -> plaintext token, committed."""
    from server.auth.service import create_token
    from server.db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(server_settings)
    factory = make_sessionmaker(engine)

    def make(scope: str, team: str | None = None, node: str | None = None) -> str:
        with session_scope(factory) as session:
            return create_token(session, scope=scope, team=team, node=node)

    yield make
    engine.dispose()


@pytest.fixture
def api(server_settings):
    """A TestClient over the real app (lifespan run) on the session's Postgres."""
    from fastapi.testclient import TestClient

    from server.app import create_app

    with TestClient(create_app(server_settings)) as client:
        yield client


@pytest.fixture(scope="session")
def redis_url():
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    yield REDIS_URL
    for key in client.scan_iter(f"fleetprof_test_{SESSION_TAG}*"):
        client.delete(key)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


@pytest.fixture
def cli_env(server_settings):
    """Environment for `fleetprof` subprocesses pointed at this test session's Postgres."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env.update(FLEETPROF_DATABASE_URL=server_settings.database_url, FLEETPROF_DATA_DIR=str(server_settings.data_dir),
               FLEETPROF_QUEUE_NAME=server_settings.queue_name, PYTHONUNBUFFERED="1")
    return env


@contextmanager
def server_process(env: dict[str, str], log_path: Path, *args: str,
                   on_start: Callable[[Callable[[], str]], None] | None = None) -> Iterator[str]:
    """A real `fleetprof server` process (uvicorn) on a free port with `env`; yields its base URL. Its stdout and
    stderr go to `log_path`. `on_start` receives a function that returns the server's thread stacks and log."""
    import subprocess
    import sys

    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "server", "--port", str(port), *args],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        if on_start is not None:
            on_start(lambda: _server_dump(proc, log_path))
        try:
            try:
                wait_http(url + "/healthz", timeout_s=60.0)  # a cold import on a loaded 2-core machine
            except TimeoutError as exc:  # say why: the server's own log (an import error, a port, a proxy)
                raise TimeoutError(f"{exc}; server log:\n{_server_dump(proc, log_path)}") from None
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _server_dump(proc, log_path: Path) -> str:  # type: ignore[no-untyped-def]
    """The server's thread stacks (SIGUSR1: faulthandler, see `fleetprof server`) and the tail of its log."""
    import signal
    import time

    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    return log_path.read_text(errors="replace")[-20_000:] if log_path.exists() else "(no log)"


SERVER_DUMPS = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """A failing test that ran a live server shows where the server was (stacks, log) beside the failure: a
    request that hung in CI says what it waited on."""
    report = yield
    if report.when == "call" and report.failed:
        for dump in item.stash.get(SERVER_DUMPS, []):
            report.sections.append(("live server: thread stacks and log", dump()))
    return report


@pytest.fixture
def live_server(cli_env, tmp_path, request):
    """A real `fleetprof server` on this test session's Postgres; yields its base URL."""
    dumps = request.node.stash.setdefault(SERVER_DUMPS, [])
    with server_process(cli_env, tmp_path / "server.log", on_start=dumps.append) as url:
        yield url
