"""Calls back once a watched top-level module has been imported: how a `fleetprof.profile()` block learns of a
framework the program imports inside it (`def main(): import keras ...` under the decorator).

The same mechanism as the `sitecustomize` of `fleetprof run` (agent/hooks/_site/sitecustomize.py, which must stay
free of fleetprof imports and so cannot share this code): a finder first on `sys.meta_path` that, asked for a watched
name, finds its spec through the other finders and wraps the loader's `exec_module`, so that `on_imported(name)` runs
right after the module has loaded. It imports nothing itself, and leaves `sys.meta_path` at `close()` or once every
name has been seen.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("fleetprof.profile")


class ImportWatcher:
    """Meta-path finder: `on_imported(name)` after each watched name's first import (`start()` puts it in place)."""

    def __init__(self, names: Iterable[str], on_imported: Callable[[str], None]):
        self.names = set(names)
        self.on_imported = on_imported
        self._lock = threading.Lock()

    def start(self) -> ImportWatcher:
        if self.names:
            sys.meta_path.insert(0, self)
        return self

    def close(self) -> None:
        with self._lock:
            self.names.clear()
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        with self._lock:
            if fullname not in self.names:
                return None
            self.names.discard(fullname)
            done = not self.names
        if done:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders' answer (the name is no longer ours)
            loader: Any = getattr(spec, "loader", None)
            original = getattr(loader, "exec_module", None)
            if spec is None or original is None:
                return spec
            on_imported = self.on_imported

            def exec_module(module: ModuleType) -> None:
                try:
                    original(module)
                finally:
                    with contextlib.suppress(AttributeError):
                        del loader.exec_module
                try:
                    on_imported(fullname)
                except Exception as exc:  # noqa: BLE001 - the program's import must never fail because of us
                    log.warning("fleetprof.profile: no hooks for %s: %s", fullname, exc)

            loader.exec_module = exec_module
            return spec
        except Exception as exc:  # noqa: BLE001 - let the normal finders import it untouched
            log.warning("fleetprof.profile: %s not watched: %s", fullname, exc)
            return None
