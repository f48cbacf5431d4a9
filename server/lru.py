"""A small thread-safe, process-local LRU for values keyed by what identifies one stored version of them (so an
entry is never stale, only unused until evicted): cached reports' right-sizing inputs, decoded plot views."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: list[K]) -> dict[K, V]:
        with self._lock:
            found = {k: self._entries[k] for k in keys if k in self._entries}
            for k in found:
                self._entries.move_to_end(k)
        return found

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
