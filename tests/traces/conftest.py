"""Real Kineto traces from tests/data/kineto (see tests/data/SOURCES.md)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def kineto_dir(real_data: Path) -> Path:
    return real_data / "kineto"


@pytest.fixture(scope="session")
def dlrm_dir(kineto_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """param's 8-rank DLRM step, extracted once: one `.pt.trace.json` per rank."""
    out = tmp_path_factory.mktemp("dlrm")
    with tarfile.open(kineto_dir / "param" / "dlrm_kineto.tar.gz") as tar:
        tar.extractall(out, filter="data")
    files = sorted((out / "dlrm_kineto").glob("*.json"))
    assert len(files) == 8
    return out / "dlrm_kineto"
