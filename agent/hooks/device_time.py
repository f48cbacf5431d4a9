"""A step's device time: CUDA events recorded at its boundaries, read once complete (query, never synchronize)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PENDING_MAX = 64  # step events held for their device time; beyond, sent with it unknown


class DeviceTimer:
    def __init__(self, torch: Any, put: Callable[[dict[str, Any]], None]):
        self._torch = torch
        self._put = put
        self._start: Any = None
        self._pending: list[tuple[dict[str, Any], Any, Any]] = []

    def _recorded(self) -> Any:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def first_forward(self) -> None:
        """The first step starts at the first forward of the model."""
        if self._torch.cuda.is_initialized() and self._start is None:
            self._start = self._recorded()

    def end_step(self, *, cuda: bool) -> tuple[Any, Any]:
        """(start, end) events of the step ending now; end is None when its start was never recorded."""
        return self._start, (self._recorded() if cuda and self._start is not None else None)

    def next_step(self, end: Any, *, cuda: bool) -> None:
        self._start = end
        if cuda and end is None:
            self._start = self._recorded()

    def send(self, ev: dict[str, Any], start: Any, end: Any) -> None:
        """Send `ev` now, or once its device time is known."""
        if end is not None:
            self._pending.append((ev, start, end))
        else:
            self._put(ev)

    def drain(self, *, final: bool) -> None:
        """Send the step events whose end events have completed; with `final` (or too many held), all."""
        keep = []
        for ev, start, end in self._pending:
            if end.query():
                ev["device_s"] = max(0.0, start.elapsed_time(end) / 1000.0)
                self._put(ev)
            elif final or len(self._pending) > PENDING_MAX:
                self._put(ev)  # device time unknown: null, not a guess
            else:
                keep.append((ev, start, end))
        self._pending = keep
