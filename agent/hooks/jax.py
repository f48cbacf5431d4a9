"""JAX instrumentation: step boundaries, step time, samples and device memory (`device.memory_stats()`).

JAX has no optimizer object or training loop of its own to hook (an optax update is a pure function, usually
traced once into a jitted step), so a JAX loop marks its steps with one line, either of:

    from agent.hooks.jax import train_step

    @train_step            # above @jax.jit: each call is one step, timed until its outputs are ready
    @jax.jit
    def update(state, batch): ...

or `agent.hooks.fleetprof_step(samples=..., wait=loss)` at the end of each iteration. Both are no-ops (the
function is called as it is) when the job does not run under `fleetprof run` (no hooks installed). Keras on the
JAX backend needs neither: `agent.hooks.keras` counts its steps.

Step rule (documented contract):
  * `@train_step`: a step runs from the previous step's end (the first: the call's start) to the moment the
    call's outputs are ready (`jax.block_until_ready`: JAX dispatches asynchronously, and a step timed at its
    dispatch would take microseconds). `samples` = the leading dimension of the first array in the argument
    `batch_argnum` (default 1: `update(state, batch)`), unknown (null) where there is none.
  * `fleetprof_step(samples=None, wait=None)`: ends a step; `wait` (e.g. the loss) is waited for first. The first
    step runs from the hooks' installation (the import of jax), so it holds the program's start-up.
Memory per step: `device_memory.JaxMemory` (XLA's allocator peak since start on an accelerator; the process RSS on
the CPU backend). The hooks send their `job_start` at the first step only: Keras imports jax whenever it is
installed, and a process that takes no JAX step says nothing from here.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent.config import AgentSettings
from agent.hooks.device_memory import JaxMemory
from agent.hooks.events import EventFactory, sample_count
from agent.hooks.framework_info import host_memory_bytes
from agent.hooks.memory import RssPeak
from agent.hooks.sender import EventSender
from fleetprof.client import Client

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_current: JaxProfiler | None = None
_install_lock = threading.Lock()


def current() -> JaxProfiler | None:
    """The JAX profiler installed in this process, if any."""
    return _current


class JaxProfiler:
    """Turns step marks into StepEvents with JAX device memory."""

    def __init__(self, jax: Any, *, job_id: str, sender: EventSender, rss: RssPeak | None = None,
                 clock: Callable[[], float] = time.time, perf: Callable[[], float] = time.perf_counter):
        self.jax = jax
        self.sender = sender
        self._perf = perf
        self._job_id = job_id
        self._clock = clock
        self._rss = rss or RssPeak()
        # Made at the first step, not at install (the import of jax): asking for devices initializes JAX's
        # backends, which a program may still be configuring (jax.config.update("jax_platforms", ...)).
        self._memory: JaxMemory | None = None
        self._events: EventFactory | None = None
        self.device: str | None = None
        self.enabled = False
        self._failed = False
        self.steps_done = 0
        self._step_start: float | None = None
        self._job_start_sent = False
        self._sizes: dict[int, int] = {}
        self._info_sent: dict[str, Any] | None = None

    def install(self, *, process_hooks: bool = True) -> JaxProfiler:
        self.enabled = True
        self._step_start = self._perf()
        if process_hooks:
            atexit.register(self.close)
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        if self.enabled and self.steps_done:
            try:
                self._send_info()
            except Exception as exc:
                self._fail(exc)
        self.enabled = False
        self.sender.close(timeout_s)

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            log.warning("fleetprof hooks: disabled after an internal error: %r", exc, exc_info=exc)
        self.enabled = False

    # ------------------------------------------------------------------ steps

    def step(self, samples: Any = None, wait: Any = None) -> None:
        """End a training step (safe to call when disabled); `wait` is waited for first."""
        if not self.enabled:
            return
        try:
            if wait is not None:
                self.jax.block_until_ready(wait)
            self._boundary(sample_count(samples) if samples is not None else None)
        except Exception as exc:
            self._fail(exc)

    def run_step(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 batch_argnum: int | None) -> Any:
        """One call of a `@train_step` function: timed to its outputs' readiness."""
        if self._step_start is None or self.steps_done == 0:
            self._step_start = self._perf()
        out = fn(*args, **kwargs)
        try:
            self.jax.block_until_ready(out)
            samples = self._leading_dim(args[batch_argnum]) if batch_argnum is not None and \
                len(args) > batch_argnum else None
            self._boundary(samples)
        except Exception as exc:
            self._fail(exc)
        return out

    def _leading_dim(self, batch: Any) -> int | None:
        for leaf in self.jax.tree_util.tree_leaves(batch):
            shape = getattr(leaf, "shape", None)
            if shape:
                return int(shape[0])
        return None

    def _boundary(self, samples: int | None) -> None:
        if self._events is None or self._memory is None:
            jax = self.jax
            device = jax.local_devices()[0]
            self.device = f"{device.platform}:{device.id}"
            self._memory = JaxMemory(jax, self._rss)
            self._events = EventFactory(None, self._job_id, self._clock, framework=f"jax {jax.__version__}",
                                        device=self.device, rank=int(jax.process_index()))
        if not self._job_start_sent:
            self._job_start_sent = True
            self.sender.put(self._events.job_start())
        start = self._step_start if self._step_start is not None else self._perf()
        step = self.steps_done
        ev = self._events.step(step, samples)
        self._memory.add(ev, step=step, step_start=start)
        if samples is not None:
            self._sizes[samples] = self._sizes.get(samples, 0) + 1
        self.steps_done = done = step + 1
        if done & (done - 1) == 0:
            self._send_info()
        now = self._perf()
        ev["wall_s"] = max(0.0, now - start)
        self._step_start = now
        self.sender.put(ev)

    def _send_info(self) -> None:
        if self._events is None or self._memory is None:
            return
        info: dict[str, Any] = {"device": self.device}
        if self._sizes:
            info.update(batch_size=max(self._sizes, key=lambda k: self._sizes[k]), batch_size_source="forward_input")
        if not self._memory.on_device:
            total = host_memory_bytes()
            info.update(device_memory_total_bytes=total, device_memory_source="host_memory" if total else None)
        if info != self._info_sent:
            self._info_sent = info
            ev = self._events.base("framework_info")
            ev.update({k: v for k, v in info.items() if v is not None})
            self.sender.put(ev)


def train_step(fn: F | None = None, *, batch_argnum: int | None = 1) -> Any:
    """Decorator: each call of `fn` is one training step (see the module docstring). Usable bare or with
    `batch_argnum=` (None: samples unknown)."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            prof = _current
            if prof is None or not prof.enabled:
                return f(*args, **kwargs)
            return prof.run_step(f, args, kwargs, batch_argnum)

        return wrapper  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap


def step(samples: Any = None, wait: Any = None) -> None:
    """End a JAX training step; a no-op without hooks."""
    prof = _current
    if prof is not None:
        prof.step(samples, wait)


def install(settings: AgentSettings | None = None, *, transport: Client | None = None) -> JaxProfiler | None:
    """Install the JAX hooks in this process once (idempotent); None when off or not configured."""
    global _current
    with _install_lock:
        if _current is not None:
            return _current
        settings = settings or AgentSettings()
        if settings.hooks_level == "off":
            return None
        if not settings.job_id or not (settings.server_url or transport):
            log.info("fleetprof hooks: no job id or server URL; hooks not installed")
            return None
        import jax

        transport = transport or Client(settings.server_url or "", settings.token, timeout_s=5.0)
        prof = JaxProfiler(jax, job_id=settings.job_id, sender=EventSender(transport))
        _current = prof.install()
        return prof
