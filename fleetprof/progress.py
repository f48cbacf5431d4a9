"""A one-line progress bar on stderr for long CLI work (replays, uploads), drawn only on a terminal.

Redrawn in place with `\\r` at most `MIN_REDRAW_S` apart; off when the stream is not a TTY (a pipe, a log file, a
CI job), so that scripts and logs never see it. No dependency.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

MIN_REDRAW_S = 0.1  # at most 10 redraws a second: a replay sends thousands of small batches
BAR_WIDTH = 30


class Progress:
    """`update(done)` as work advances towards `total` (in `unit`s); `close()` ends the line."""

    def __init__(self, label: str, total: float, *, unit: str = "", stream: TextIO | None = None,
                 fmt: Callable[[float], str] | None = None, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream)
        self.fmt = fmt or (lambda v: f"{v:,.0f}")
        self.clock = clock
        self._drawn_at: float | None = None
        self._width = 0

    def update(self, done: float) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self._drawn_at is not None and now - self._drawn_at < MIN_REDRAW_S and done < self.total:
            return
        self._drawn_at = now
        fraction = min(1.0, done / self.total) if self.total > 0 else 1.0
        filled = int(fraction * BAR_WIDTH)
        line = (f"{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * fraction:5.1f} % "
                f"{self.fmt(done)}/{self.fmt(self.total)}{' ' + self.unit if self.unit else ''}")
        self.stream.write("\r" + line.ljust(self._width))  # pad over a longer previous line
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """End the bar's line (nothing when no bar was drawn), so the next message starts on its own."""
        if self.enabled and self._drawn_at is not None:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
