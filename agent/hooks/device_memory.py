"""Per-step device memory peaks outside PyTorch: TensorFlow's and JAX's allocators, or the process RSS on a CPU.

Each reader writes a step event's memory fields (`allocated_peak_bytes`, `reserved_peak_bytes`, `memory_source`) as
`memory.StepMemory` does for PyTorch, and takes the framework module as an argument (imported by the caller, never
here):
  * TensorFlow on a GPU: `tf.config.experimental.get_memory_info("GPU:0")["peak"]`, reset after each reading with
    `reset_memory_stats` (a per-step peak): `memory_source="tf_allocator"`.
  * JAX on an accelerator: `device.memory_stats()` (XLA's allocator: `peak_bytes_in_use`, `bytes_reserved`). XLA
    offers no reset, so the peak is since the process started: `memory_source="jax_allocator"`.
  * Otherwise (a CPU backend: `memory_stats()` is None there) the process RSS peak, as for a CPU-only PyTorch run:
    `memory_source="cpu_rss"`.
A reader that fails once is logged and falls back to the RSS for the rest of the run.
"""

from __future__ import annotations

import logging
from typing import Any

from agent.hooks.memory import RssPeak, StepMemory

log = logging.getLogger(__name__)


class _Host:
    """The RSS branch of `StepMemory` (rate-limited /proc reads), for every reader's CPU case."""

    def __init__(self, rss: RssPeak):
        self._mem = StepMemory(None, rss)

    def add(self, ev: dict[str, Any], *, step: int, step_start: float) -> None:
        self._mem.add(ev, cuda=False, step=step, step_start=step_start)


class TfMemory:
    """TensorFlow: the first GPU's allocator peak per step, else the RSS."""

    def __init__(self, tf: Any, rss: RssPeak):
        self._host = _Host(rss)
        self._tf = tf
        self.device: str | None = None
        try:
            if tf.config.list_logical_devices("GPU"):
                self.device = "GPU:0"
        except Exception as exc:
            log.info("fleetprof hooks: TensorFlow devices unreadable (%r); memory from the RSS", exc)

    def add(self, ev: dict[str, Any], *, step: int, step_start: float) -> None:
        if self.device is not None:
            try:
                exp = self._tf.config.experimental
                peak = int(exp.get_memory_info(self.device)["peak"])
                exp.reset_memory_stats(self.device)
            except Exception as exc:
                log.info("fleetprof hooks: get_memory_info(%s) failed (%r); memory from the RSS", self.device, exc)
                self.device = None
            else:
                ev["allocated_peak_bytes"] = peak
                ev["memory_source"] = "tf_allocator"
                return
        self._host.add(ev, step=step, step_start=step_start)


class JaxMemory:
    """JAX: the first local device's `memory_stats()` (None on the CPU backend, then the RSS)."""

    def __init__(self, jax: Any, rss: RssPeak):
        self._host = _Host(rss)
        self._device: Any = None
        try:
            device = jax.local_devices()[0]
            if device.memory_stats():
                self._device = device
        except Exception as exc:
            log.info("fleetprof hooks: JAX memory_stats unreadable (%r); memory from the RSS", exc)

    @property
    def on_device(self) -> bool:
        return self._device is not None

    def add(self, ev: dict[str, Any], *, step: int, step_start: float) -> None:
        if self._device is not None:
            try:
                stats = self._device.memory_stats() or {}
            except Exception as exc:
                log.info("fleetprof hooks: memory_stats failed (%r); memory from the RSS", exc)
                self._device = None
            else:
                peak, reserved = stats.get("peak_bytes_in_use"), stats.get("bytes_reserved")
                ev["allocated_peak_bytes"] = int(peak) if peak is not None else None
                ev["reserved_peak_bytes"] = int(reserved) if reserved else None
                ev["memory_source"] = "jax_allocator"
                return
        self._host.add(ev, step=step, step_start=step_start)

