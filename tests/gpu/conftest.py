"""Checks that need a real NVIDIA GPU: opt-in (`make test-gpu`, i.e. `pytest -m gpu`); CI never runs them.

Every test here is marked `gpu` by this folder. On a machine without a GPU they fail (they do not skip): a GPU
run that silently checked nothing would read as a pass. The recorder and script runner of the hooks tests are
shared from tests/hooks.
"""

from __future__ import annotations

import pytest

from tests.hooks.conftest import recorder  # noqa: F401 - a fixture, re-exported for tests/gpu


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def nvml_devices():
    """The real NVML device set of this machine; fails when there is none."""
    from agent.devices.base import DeviceUnavailableError
    from agent.devices.nvml import NvmlDevices

    try:
        devices = NvmlDevices()
    except DeviceUnavailableError as exc:
        pytest.fail(f"marked gpu, but NVML is not usable here: {exc}")
    assert devices.gpus(), "NVML answered but lists no GPU"
    yield devices
    devices.close()


@pytest.fixture(scope="session")
def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.fail("marked gpu, but torch sees no CUDA device (is the CPU build installed?)")
    return torch


def _postgres_reachable() -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", 5432)) == 0


@pytest.fixture
def server_settings(request, tmp_path):
    """The suite's Postgres where this GPU machine runs one; otherwise the product's embedded mode (SQLite under
    tmp_path, tasks in-process, what `fleetprof up` runs on), migrated with the same Alembic migrations. A rented
    GPU box seldom has Postgres, and these checks are about the GPU, not the database."""
    if _postgres_reachable():
        return request.getfixturevalue("_postgres_server_settings")
    from server.config import ServerSettings
    from server.migrate import upgrade

    settings = ServerSettings(database_url=None, broker_url=None, data_dir=tmp_path / "fleetprof")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings)
    return settings


@pytest.fixture
def _postgres_server_settings(pg_url, clean_db, tmp_path):
    from server.config import ServerSettings

    return ServerSettings(database_url=pg_url, broker_url=None, data_dir=tmp_path / "fleetprof")


@pytest.fixture
def cli_env(server_settings):
    """`fleetprof` subprocesses on the same store as server_settings (embedded: no FLEETPROF_DATABASE_URL)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env.update(FLEETPROF_DATA_DIR=str(server_settings.data_dir), PYTHONUNBUFFERED="1")
    if server_settings.database_url:
        env["FLEETPROF_DATABASE_URL"] = server_settings.database_url
    return env
