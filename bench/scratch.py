"""What benchmarks set up and tear down: a throwaway Postgres database (created on the server of
FLEETPROF_TEST_PG_ADMIN_URL, default the local Postgres with trust auth, dropped at the end whatever happens) and a
real `fleetprof server` process on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

ADMIN_URL = os.environ.get("FLEETPROF_TEST_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """Yields the URL of a new database named `<prefix>_<pid>`; drops it (closing its connections) on exit."""
    name = f"{prefix}_{os.getpid()}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def fleetprof_server(env: dict[str, str], port: int, cwd: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real `fleetprof server` process (warnings only) on `port` with `env`: yields (base URL, process) once
    /healthz answers; stopped on exit."""
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "server", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=cwd)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fleetprof server did not start on {base}")
            time.sleep(0.1)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
