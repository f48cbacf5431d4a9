"""What benchmarks set up and tear down: a throwaway Postgres database (created on the server of
FLEETPROF_TEST_PG_ADMIN_URL, default the local Postgres with trust auth, dropped at the end whatever happens), a
fleet of H100 nodes in it, and a real `fleetprof server` process on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine, text

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


def insert_h100_nodes(conn: Connection, nodes: int, gpus_per_node: int) -> None:
    """`nodes` nodes named node-00000.. with `gpus_per_node` healthy H100s each (uuid GPU-<node id>-<index>)."""
    conn.execute(text("INSERT INTO nodes (name, dropped_samples_total, created_at) "
                      "SELECT format('node-%s', lpad(n::text, 5, '0')), 0, now() "
                      "FROM generate_series(0, :n - 1) n"), {"n": nodes})
    conn.execute(text("INSERT INTO gpus (node_id, uuid, index, name, memory_total_bytes, healthy) "
                      "SELECT n.id, format('GPU-%s-%s', n.id, i), i, 'NVIDIA H100 80GB HBM3', 85520809984, true "
                      "FROM nodes n, generate_series(0, :per - 1) i ORDER BY n.id, i"), {"per": gpus_per_node})
