"""The top-level module forward calls of a Kineto trace recorded with `with_stack=True` (or `with_modules`).

Such a trace holds a `python_function` event `nn.Module: <Class>_<n>` per module call, nested by time on the
calling thread. Depth 0 is the outermost module call the trace holds (the model's own, unless the window opened
inside it), depth 1 its children's: the top-level modules, as the estimate counts them (named children of the
model). An allocation made while a depth-1 call runs belongs to that module.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

from server.analysis.traces.reader import iter_events, open_trace

MODULE_PREFIX = "nn.Module: "
OUTSIDE_CHILDREN = "(model, outside its children)"


@dataclass(frozen=True)
class ModuleSpans:
    """Depth-1 calls (start, end, name) and depth-0 calls (start, end, name), each sorted by start; microseconds.
    Calls of different threads may overlap."""

    top_level: list[tuple[float, float, str]]
    roots: list[tuple[float, float, str]]
    _top_max_end: list[float] = field(init=False, repr=False)
    _root_max_end: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_top_max_end", list(accumulate((end for _, end, _ in self.top_level), max)))
        object.__setattr__(self, "_root_max_end", list(accumulate((end for _, end, _ in self.roots), max)))

    def top_level_at(self, ts_us: float) -> str | None:
        """The top-level module running at `ts_us`; OUTSIDE_CHILDREN inside the model's call but between its
        children; None outside any module call."""
        name = _containing(self.top_level, self._top_max_end, ts_us)
        if name is not None:
            return name
        return OUTSIDE_CHILDREN if _containing(self.roots, self._root_max_end, ts_us) is not None else None


def _containing(spans: list[tuple[float, float, str]], max_ends: list[float], ts: float) -> str | None:
    """The name of the latest-starting span that holds `ts` (spans sorted by start; running max of ends)."""
    i = bisect.bisect_right(spans, (ts, float("inf"), "")) - 1
    while i >= 0 and max_ends[i] > ts:
        if spans[i][1] > ts:
            return spans[i][2]
        i -= 1
    return None


def read_module_spans(source: str | Path) -> ModuleSpans | None:
    """None when the trace has no `nn.Module:` events (recorded without stacks)."""
    per_thread: dict[tuple[object, object], list[tuple[float, float, str]]] = {}
    with open_trace(source) as stream:
        for ev in iter_events(stream):
            name = ev.get("name")
            if ev.get("cat") != "python_function" or not isinstance(name, str) or not name.startswith(MODULE_PREFIX):
                continue
            ts, dur = ev.get("ts"), ev.get("dur")
            if ts is None or dur is None:
                continue
            per_thread.setdefault((ev.get("pid"), ev.get("tid")), []).append(
                (float(ts), float(ts) + float(dur), name[len(MODULE_PREFIX):]))
    if not per_thread:
        return None
    top: list[tuple[float, float, str]] = []
    roots: list[tuple[float, float, str]] = []
    for calls in per_thread.values():
        stack: list[float] = []  # ends of the enclosing calls
        for start, end, name in sorted(calls, key=lambda c: (c[0], -c[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack:
                roots.append((start, end, name))
            elif len(stack) == 1:
                top.append((start, end, name))
            stack.append(end)
    return ModuleSpans(sorted(top), sorted(roots))
