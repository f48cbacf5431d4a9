"""embedded.import_watch: the callback runs once, after the watched module has loaded, and the finder leaves
`sys.meta_path`; a callback that raises never fails the program's import; `close()` stops the watch."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedded.import_watch import ImportWatcher


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    for name in ("fpw_alpha", "fpw_beta", "fpw_gamma"):
        (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("fpw_alpha", "fpw_beta", "fpw_gamma"):
        sys.modules.pop(name, None)


def test_the_callback_runs_once_after_the_module_loaded(modules: Path) -> None:
    seen: list[tuple[str, int]] = []
    watcher = ImportWatcher(["fpw_alpha", "fpw_beta"], lambda name: seen.append((name, sys.modules[name].VALUE)))
    watcher.start()
    try:
        importlib.import_module("fpw_alpha")
        importlib.reload(sys.modules["fpw_alpha"])
        assert seen == [("fpw_alpha", 42)] and watcher in sys.meta_path  # beta still awaited
        importlib.import_module("fpw_beta")
        assert seen == [("fpw_alpha", 42), ("fpw_beta", 42)] and watcher not in sys.meta_path
    finally:
        watcher.close()


def test_a_failing_callback_leaves_the_import_alone_and_close_stops_the_watch(modules: Path) -> None:
    def boom(name: str) -> None:
        raise RuntimeError("hooks broke")

    watcher = ImportWatcher(["fpw_alpha", "fpw_gamma"], boom).start()
    assert importlib.import_module("fpw_alpha").VALUE == 42
    seen: list[str] = []
    watcher.on_imported = seen.append
    watcher.close()
    assert watcher not in sys.meta_path
    importlib.import_module("fpw_gamma")
    assert seen == []
