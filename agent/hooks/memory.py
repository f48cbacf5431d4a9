"""Per-step memory peaks: the CUDA caching allocator's counters, or the process RSS on a CPU-only run."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class RssPeak:
    """Peak resident set size per step from /proc: VmHWM, reset after each read through clear_refs.

    Writing "5" to /proc/self/clear_refs resets the high-water mark (Linux >= 4.0), so each reading is
    the peak of one step. Where the reset is refused, the reading is the peak since process start: still
    a true peak, just not per step. Reported as `memory_source="cpu_rss"`.
    Both files stay open (pread/write on the descriptors): this runs once per training step, and
    open()+close() was most of its cost. The descriptors are reopened after a fork (they name a pid).
    """

    def __init__(self, proc_self: Path = Path("/proc/self")):
        self._status_path = proc_self / "status"
        self._clear_refs_path = proc_self / "clear_refs"
        self._status_fd: int | None = None
        self._clear_fd: int | None = None
        self._pid = -1
        self._can_reset = True
        self.available = self._status_path.is_file()

    def _open(self) -> None:
        self.close()
        self._pid = os.getpid()
        self._status_fd = os.open(self._status_path, os.O_RDONLY | os.O_CLOEXEC)
        if self._can_reset:
            try:
                self._clear_fd = os.open(self._clear_refs_path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                self._cannot_reset()

    def _cannot_reset(self) -> None:
        self._can_reset = False
        log.info("fleetprof hooks: cannot reset VmHWM; CPU peaks are since process start")

    def close(self) -> None:
        for fd in (self._status_fd, self._clear_fd):
            if fd is not None:
                os.close(fd)
        self._status_fd = self._clear_fd = None

    def read_and_reset(self) -> int | None:
        if not self.available:
            return None
        try:
            if self._pid != os.getpid():
                self._open()
            assert self._status_fd is not None
            data = os.pread(self._status_fd, 8192, 0)
            i = data.find(b"VmHWM:")
            peak = int(data[i + 6:data.index(b"kB", i)]) * 1024 if i >= 0 else None
        except (OSError, ValueError):
            self.available = False
            log.info("fleetprof hooks: %s unreadable, CPU memory not reported", self._status_path)
            return None
        if self._clear_fd is not None:
            try:
                os.write(self._clear_fd, b"5")
            except OSError:
                self._cannot_reset()
                os.close(self._clear_fd)
                self._clear_fd = None
        return peak


def cuda_peaks_and_reset(torch: Any) -> tuple[int, int]:
    """(max allocated, max reserved) bytes since the last reset on the current device, then reset.

    These are host-side allocator counters: reading them does not synchronize the device.
    """
    allocated = int(torch.cuda.max_memory_allocated())
    reserved = int(torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    return allocated, reserved


class CudaPeaks:
    """`cuda_peaks_and_reset` at a per-step price: one read of the allocator's counters, one reset.

    `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` each flatten the allocator's whole
    statistics tree (about 150 entries, sorted) in Python, to read one number: on a slow host that was the
    largest part of the hooks' cost per step. This reads the nested statistics once and picks both peaks.
    Where the private bindings are missing (another torch build), the public calls are used.
    """

    def __init__(self, torch: Any):
        self._torch = torch
        c = torch._C
        names = ("_cuda_getDevice", "_cuda_memoryStats", "_cuda_resetPeakMemoryStats")
        self._fast = all(hasattr(c, n) for n in names)
        if self._fast:
            self._device, self._stats, self._reset = (getattr(c, n) for n in names)

    def read_and_reset(self) -> tuple[int, int]:
        if not self._fast:
            return cuda_peaks_and_reset(self._torch)
        device = self._device()
        stats = self._stats(device)
        self._reset(device)
        try:
            return int(stats["allocated_bytes"]["all"]["peak"]), int(stats["reserved_bytes"]["all"]["peak"])
        except (KeyError, TypeError):  # a layout this code does not know: the public calls from now on
            self._fast = False
            return cuda_peaks_and_reset(self._torch)


def cuda_allocated_reader(torch: Any) -> Callable[[], int]:
    """A function returning the bytes allocated on the current device now: `torch.cuda.memory_allocated()`,
    without flattening the allocator's statistics tree in Python (about 100 us a call on a slow host; the
    per-module sampler calls it twice per module call)."""
    c = torch._C
    if not all(hasattr(c, n) for n in ("_cuda_getDevice", "_cuda_memoryStats")):
        return lambda: int(torch.cuda.memory_allocated())
    device, stats = c._cuda_getDevice, c._cuda_memoryStats

    def allocated() -> int:
        return int(stats(device())["allocated_bytes"]["all"]["current"])

    return allocated


RSS_EVERY_STEP_UNTIL = 8  # steps 0-7 always read the RSS peak (warm-up: where a CPU run's peak usually is)
RSS_MIN_INTERVAL_S = 0.02  # after them, at most one /proc read per this much training time


class StepMemory:
    """Writes a step event's memory fields: the allocator's peaks on CUDA, the RSS peak on a CPU-only run.

    CUDA: every step (host-side counters, one read and one reset: `CudaPeaks`).
    CPU: reading /proc/self/status costs 10-40 us, as much as the rest of the hooks' work per step together; on
    steps shorter than RSS_MIN_INTERVAL_S it is read at that rate instead of every step (every step of the first
    RSS_EVERY_STEP_UNTIL). VmHWM is reset only when read, so the step that reads it carries the peak since the
    previous reading (its own and the unread steps' before it), and the steps between carry no memory fields
    (unknown, not zero): the maximum over the run is unchanged, except for the steps after the last reading
    (less than RSS_MIN_INTERVAL_S of training at the end of the run).
    """

    def __init__(self, torch: Any | None, rss: RssPeak):
        # None: a process without torch (Keras on JAX or TensorFlow, JAX): the CPU branch only
        self.cuda_peaks = CudaPeaks(torch) if torch is not None else None
        self.rss = rss
        self._rss_read_at = float("-inf")

    def add(self, ev: dict[str, Any], *, cuda: bool, step: int, step_start: float) -> None:
        if cuda and self.cuda_peaks is not None:
            ev["allocated_peak_bytes"], ev["reserved_peak_bytes"] = self.cuda_peaks.read_and_reset()
            ev["memory_source"] = "cuda_allocator"
            return
        if step >= RSS_EVERY_STEP_UNTIL and step_start - self._rss_read_at < RSS_MIN_INTERVAL_S:
            return
        self._rss_read_at = step_start
        peak = self.rss.read_and_reset()
        if peak is not None:
            # RSS is what the process holds, the CPU analogue of "reserved"; allocated is unknown.
            ev["reserved_peak_bytes"] = peak
            ev["memory_source"] = "cpu_rss"

