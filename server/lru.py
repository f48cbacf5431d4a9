"""A small thread-safe, process-local LRU for values keyed by what identifies one stored version of them (so an
entry is never stale, only unused until evicted): cached reports' right-sizing inputs, decoded plot views."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    def __init__(self, max_entries: int, *, max_weight: int | None = None, weigh: Callable[[V], int] | None = None):
        """At most `max_entries` entries and, with `weigh`, at most `max_weight` in total (e.g. bytes); a value
        heavier than that alone is not kept."""
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self._weight = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: list[K]) -> dict[K, V]:
        with self._lock:
            found = {k: self._entries[k][0] for k in keys if k in self._entries}
            for k in found:
                self._entries.move_to_end(k)
        return found

    def put(self, key: K, value: V) -> None:
        weight = self._weigh(value) if self._weigh is not None else 0
        with self._lock:
            self._drop(key)
            if self.max_weight is not None and weight > self.max_weight:
                return
            self._entries[key] = (value, weight)
            self._weight += weight
            while len(self._entries) > self.max_entries or (
                    self.max_weight is not None and self._weight > self.max_weight):
                self._drop(next(iter(self._entries)))

    def _drop(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._weight -= entry[1]
