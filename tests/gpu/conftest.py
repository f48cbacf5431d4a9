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
