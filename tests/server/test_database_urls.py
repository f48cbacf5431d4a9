"""Database and broker URLs as people write them (issue 14.4), through the real `fleetprof` commands and Postgres.

Each accepted form migrates a database of its own with `fleetprof db upgrade` and serves it with `fleetprof server`;
an unsupported scheme and a never-migrated database are one line and exit 2, never a traceback (and never the URL:
it may carry a password).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server import urls
from tests.conftest import PG_ADMIN_URL, SESSION_TAG, server_process

PG_HOSTPATH = PG_ADMIN_URL.split("://", 1)[1].rsplit("/", 1)[0]  # postgres@127.0.0.1:5432
POSTGRES_FORMS = ["postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"]


def fleetprof(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetprof.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def env_for(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env.update(FLEETPROF_DATA_DIR=str(tmp_path / "data"), FLEETPROF_QUEUE_NAME=f"fleetprof_test_{SESSION_TAG}",
               PYTHONUNBUFFERED="1")
    env.update({f"FLEETPROF_{k.upper()}": v for k, v in settings.items()})
    return env


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database of this test's own with nothing in it; yields its name."""
    from sqlalchemy import create_engine, text

    name = f"fleetprof_test_{SESSION_TAG}_urls_{os.urandom(3).hex()}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


# ------------------------------------------------------------------ the normalising function itself


@pytest.mark.parametrize("scheme", POSTGRES_FORMS + ["POSTGRESQL"])
def test_every_postgres_form_uses_psycopg2_when_installed(scheme):
    assert urls.database_url(f"{scheme}://u:p%40ss@h:5433/db?sslmode=require") == \
        "postgresql+psycopg2://u:p%40ss@h:5433/db?sslmode=require"


def test_psycopg3_is_used_when_psycopg2_is_missing():
    only3 = {"psycopg"}.__contains__
    assert urls.database_url("postgresql+psycopg2://u@h/db", installed=only3) == "postgresql+psycopg://u@h/db"
    with pytest.raises(urls.UnsupportedURL, match="pip install psycopg2-binary"):
        urls.database_url("postgres://u@h/db", installed=lambda _: False)


@pytest.mark.parametrize("url", ["mysql://u:secret@h/db", "postgresql+asyncpg://u:secret@h/db", "u:secret@h/db"])
def test_unsupported_database_urls_name_the_accepted_forms_not_the_url(url):
    with pytest.raises(urls.UnsupportedURL) as err:
        urls.database_url(url)
    assert "postgresql://" in str(err.value) and "sqlite:///" in str(err.value)
    assert "secret" not in str(err.value)


def test_broker_urls():
    assert urls.broker_url("redis://:pw@h:6380/2") == "redis://:pw@h:6380/2"
    assert urls.broker_url("REDISS://h:6380/0") == "rediss://h:6380/0"
    with pytest.raises(urls.UnsupportedURL, match="redis://"):
        urls.broker_url("amqp://guest:guest@h//")


def test_settings_carry_the_normalised_urls(tmp_path):
    from server.config import ServerSettings

    s = ServerSettings(database_url="postgres://u@h/db", broker_url="redis://h:6379/0", data_dir=tmp_path)
    assert s.sqlalchemy_url == "postgresql+psycopg2://u@h/db" and not s.embedded
    assert ServerSettings(database_url="", data_dir=tmp_path).embedded  # blank = unset, as for every variable


# ------------------------------------------------------------------ the real commands


@pytest.mark.parametrize("scheme", POSTGRES_FORMS)
def test_db_upgrade_and_server_with_each_url_form(scheme, empty_database, tmp_path):
    env = env_for(tmp_path, database_url=f"{scheme}://{PG_HOSTPATH}/{empty_database}")
    up = fleetprof(env, "db", "upgrade")
    assert up.returncode == 0, up.stderr[-3000:]
    with server_process(env, tmp_path / "server.log") as url:
        ready = httpx.get(url + "/readyz", timeout=10)  # the server's own engine read the schema: at head
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok", ready.text


def test_sqlite_url(tmp_path):
    env = env_for(tmp_path, database_url=f"sqlite:///{tmp_path / 'fp.db'}")
    up = fleetprof(env, "db", "upgrade")
    assert up.returncode == 0, up.stderr[-3000:]
    assert (tmp_path / "fp.db").stat().st_size > 0


@pytest.mark.parametrize(("command", "setting", "url"), [
    (("db", "upgrade"), "database_url", "mysql://root:secret@db.example/fleet"),
    (("server", "--port", "1"), "database_url", "postgresql+asyncpg://root:secret@db.example/fleet"),
    (("worker",), "broker_url", "amqp://root:secret@mq.example//"),
])
def test_a_bad_scheme_is_one_line_and_exit_2(command, setting, url, tmp_path):
    line = one_line_error(fleetprof(env_for(tmp_path, **{setting: url}), *command))
    assert f"FLEETPROF_{setting.upper()}" in line and "accepted forms" in line, line
    assert "secret" not in line, line


def test_a_database_never_migrated_is_refused_in_one_line(empty_database, tmp_path):
    env = env_for(tmp_path, database_url=f"postgresql://{PG_HOSTPATH}/{empty_database}")
    line = one_line_error(fleetprof(env, "server", "--port", "1"))
    assert "never migrated" in line and "fleetprof db upgrade" in line, line


def test_readyz_says_upgrade_for_a_database_never_migrated_or_behind(empty_database, tmp_path):
    """An app started some other way (a custom factory, `--workers` children) still tells the probe."""
    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.config import ServerSettings
    from server.migrate import upgrade

    settings = ServerSettings(database_url=f"postgresql://{PG_HOSTPATH}/{empty_database}", data_dir=tmp_path)
    with TestClient(create_app(settings)) as client:
        never = client.get("/readyz")
        upgrade(settings, "0009")
        behind = client.get("/readyz")
        upgrade(settings)
        ready = client.get("/readyz")
    assert never.status_code == 503 and "fleetprof db upgrade" in never.json()["checks"]["database"], never.text
    assert behind.status_code == 503 and "revision 0009" in behind.json()["checks"]["database"], behind.text
    assert ready.status_code == 200, ready.text
