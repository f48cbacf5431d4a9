"""Per-step memory peaks: the CUDA caching allocator's counters, or the process RSS on a CPU-only run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class RssPeak:
    """Peak resident set size per step from /proc: VmHWM, reset after each read through clear_refs.

    Writing "5" to /proc/self/clear_refs resets the high-water mark (Linux >= 4.0), so each reading is
    the peak of one step. Where the reset is refused, the reading is the peak since process start: still
    a true peak, just not per step. Reported as `memory_source="cpu_rss"`.
    """

    def __init__(self, proc_self: Path = Path("/proc/self")):
        self._status = proc_self / "status"
        self._clear_refs = proc_self / "clear_refs"
        self._can_reset = True
        self.available = self._status.is_file()

    def read_and_reset(self) -> int | None:
        if not self.available:
            return None
        peak: int | None = None
        try:
            with open(self._status, "rb") as f:
                for line in f:
                    if line.startswith(b"VmHWM:"):
                        peak = int(line.split()[1]) * 1024  # kB
                        break
        except (OSError, ValueError, IndexError):
            self.available = False
            log.info("fleetprof hooks: %s unreadable, CPU memory not reported", self._status)
            return None
        if self._can_reset:
            try:
                with open(self._clear_refs, "w") as f:
                    f.write("5")
            except OSError:
                self._can_reset = False
                log.info("fleetprof hooks: cannot reset VmHWM; CPU peaks are since process start")
        return peak


def cuda_peaks_and_reset(torch: Any) -> tuple[int, int]:
    """(max allocated, max reserved) bytes since the last reset on the current device, then reset.

    These are host-side allocator counters: reading them does not synchronize the device.
    """
    allocated = int(torch.cuda.max_memory_allocated())
    reserved = int(torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    return allocated, reserved
