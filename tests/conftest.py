"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO_ROOT.parent / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data in ../shared/data (Kineto traces, nvidia-smi captures, energy, cluster series)."""
    assert SHARED_DATA.is_dir(), f"real test data not found at {SHARED_DATA}"
    return SHARED_DATA
