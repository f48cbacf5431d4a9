"""A step's device time: CUDA events recorded at its boundaries, read once complete (query, never synchronize).

One event per boundary: the end event of a step is the start event of the next. `torch.cuda.Event()` and its
`record()` are Python wrappers (`record()` builds a `torch.cuda.Stream` for the current stream each time);
where the bindings below exist, events are made and recorded through them directly, and the current stream's
`Stream` object is rebuilt only when the current stream changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PENDING_MAX = 64  # step events held for their device time; beyond, sent with it unknown


class DeviceTimer:
    def __init__(self, torch: Any, put: Callable[[dict[str, Any]], None]):
        self._torch = torch
        self._put = put
        self._start: Any = None
        self.pending: list[tuple[dict[str, Any], Any, Any]] = []
        c = torch._C
        self._fast = all(hasattr(c, n) for n in ("_CudaEventBase", "_cuda_getCurrentStream", "_cuda_getDevice"))
        self._stream_key: Any = None
        self._stream: Any = None

    def _recorded(self) -> Any:
        if not self._fast:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        c = self._torch._C
        key = c._cuda_getCurrentStream(c._cuda_getDevice())  # (stream id, device index, device type)
        if key != self._stream_key:
            self._stream = self._torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
            self._stream_key = key
        ev = c._CudaEventBase(enable_timing=True)
        ev.record(self._stream)
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
            self.pending.append((ev, start, end))
        else:
            self._put(ev)

    def drain(self, *, final: bool) -> None:
        """Send the step events whose end events have completed, in step order; with `final` (or too many
        held), all. The work of one stream completes in order: the first step still running ends the scan."""
        pending = self.pending
        i, n = 0, len(pending)
        while i < n:
            ev, start, end = pending[i]
            if end.query():
                ev["device_s"] = max(0.0, start.elapsed_time(end) / 1000.0)
            elif final or n - i > PENDING_MAX:
                pass  # device time unknown: null, not a guess
            else:
                break
            self._put(ev)
            i += 1
        if i:
            del pending[:i]
