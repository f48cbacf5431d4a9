"""A step's device time: CUDA events recorded at its boundaries, read once complete (query, never synchronize).

One event per boundary: the end event of a step is the start event of the next. `torch.cuda.Event()` and its
`record()` are Python wrappers (`record()` builds a `torch.cuda.Stream` for the current stream each time);
`cuda_event_recorder` makes and records events through the bindings under them where they exist, and builds
the current stream's `Stream` object again only when the current stream changes. The per-module sampler
(layers.py) records its events with it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PENDING_MAX = 64  # step events held for their device time; beyond, sent with it unknown


def cuda_event_recorder(torch: Any) -> Callable[[], Any]:
    """A function that records a timing CUDA event on the current stream and returns it (as
    `torch.cuda.Event(enable_timing=True)` then `record()`, in a third of the time)."""
    c = torch._C
    if not all(hasattr(c, n) for n in ("_CudaEventBase", "_cuda_getCurrentStream", "_cuda_getDevice")):
        def recorded_slow() -> Any:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev

        return recorded_slow
    event, current_stream, device = c._CudaEventBase, c._cuda_getCurrentStream, c._cuda_getDevice
    last: list[Any] = [None, None]  # (stream key, its torch.cuda.Stream)

    def recorded() -> Any:
        key = current_stream(device())  # (stream id, device index, device type)
        if key != last[0]:
            last[1] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
            last[0] = key
        ev = event(enable_timing=True)
        ev.record(last[1])
        return ev

    return recorded


class DeviceTimer:
    def __init__(self, torch: Any, put: Callable[[dict[str, Any]], None]):
        self._torch = torch
        self._put = put
        self._start: Any = None
        self.pending: list[tuple[dict[str, Any], Any, Any]] = []
        self._recorder: Callable[[], Any] | None = None  # made on first use (CUDA is initialized by then)

    def _recorded(self) -> Any:
        if self._recorder is None:
            self._recorder = cuda_event_recorder(self._torch)
        return self._recorder()

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
