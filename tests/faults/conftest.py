"""Fault-injection fixtures: PRIVATE Postgres and Redis instances these tests may stop, kill and restart.

The machine's shared Postgres (5432) and Redis (6379) are never touched here: other test sessions use them.
Each fault test gets a throwaway Postgres cluster (one per pytest session, a fresh database per test, cloned
from a migrated template) and, where it needs a broker, its own `redis-server` on a free port. Collectors,
workers and agents run as real subprocesses (`python -m fleetprof.cli ...`) in their own process groups so a
test can `kill -9` exactly the process it means to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.faults.harness import Proc

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def _as_postgres(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = list(args)
    if os.geteuid() == 0:  # Postgres refuses to run as root
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


class PrivatePostgres:
    """A throwaway cluster under a temp dir, owned by the `postgres` OS user, on a free port."""

    def __init__(self, root: Path):
        assert PG_BIN is not None, "PostgreSQL server binaries not found under /usr/lib/postgresql"
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.log = root / "postgres.log"

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        res = _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), *args, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {res.stdout}{res.stderr}\n"
                               f"{self.log.read_text()[-2000:] if self.log.exists() else ''}")

    def init(self) -> None:
        res = _as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                           "--no-sync", "-E", "UTF8")
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed: {res.stdout}{res.stderr}")
        with open(self.data / "postgresql.conf", "a") as f:
            # fsync stays on: durability of acknowledged commits across an immediate stop is under test.
            f.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                    "max_connections = 200\nshared_buffers = 64MB\nlog_min_messages = warning\n")

    def start(self) -> None:
        self._ctl("-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-w", "-t", "60", "-m", mode, "stop")

    def is_running(self) -> bool:
        return _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "status").returncode == 0

    def url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{db}"


@pytest.fixture(scope="session")
def private_pg() -> Iterator[PrivatePostgres]:
    root = Path(tempfile.mkdtemp(prefix="fleetprof-faults-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    pg = PrivatePostgres(root)
    pg.init()
    pg.start()
    # One migrated template; each test gets a clone (CREATE DATABASE ... TEMPLATE is a file copy: fast).
    from sqlalchemy import create_engine, text

    from server.config import ServerSettings
    from server.migrate import upgrade

    admin = create_engine(pg.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text('CREATE DATABASE "fleetprof_template"'))
    admin.dispose()
    upgrade(ServerSettings(database_url=pg.url("fleetprof_template")))
    try:
        yield pg
    finally:
        if pg.is_running():
            pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


_db_counter = iter(range(1, 1_000_000))


@pytest.fixture
def fault_db(private_pg: PrivatePostgres) -> Iterator[str]:
    """A fresh, migrated database on the private cluster; its SQLAlchemy URL."""
    from sqlalchemy import create_engine, text

    if not private_pg.is_running():  # a previous test left it stopped
        private_pg.start()
    name = f"faults_{os.getpid()}_{next(_db_counter)}"
    admin = create_engine(private_pg.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "fleetprof_template"'))
    admin.dispose()
    yield private_pg.url(name)
    if not private_pg.is_running():
        private_pg.start()
    admin = create_engine(private_pg.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


class PrivateRedis:
    """A `redis-server` of our own, without persistence (a kill loses the queue, as a real crash would)."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.root / "redis.log", "ab")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.root)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        import redis

        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    root = tmp_path / "redis"
    root.mkdir()
    r = PrivateRedis(root)
    r.start()
    try:
        yield r
    finally:
        r.kill()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Register every Proc here; all are stopped at the end of the test, whatever happened."""
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop(timeout=10)
