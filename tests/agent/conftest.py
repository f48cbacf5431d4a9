"""Fixtures of the agent tests: the collector double and a quick FakeNvml node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.devices.fake import FakeGpu, FakeNvml
from tests.agent.collector import Collector


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.up()
    yield c
    c.down()


def make_fake(n: int = 2, **kw: object) -> FakeNvml:
    gpus = [FakeGpu(uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                    **kw) for i in range(n)]  # type: ignore[arg-type]
    return FakeNvml(gpus)


@pytest.fixture
def fake_nvml() -> FakeNvml:
    return make_fake(2)
