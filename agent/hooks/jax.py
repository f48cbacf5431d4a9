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
Fingerprint (framework_info, `framework` "jax"): a `@train_step` function's argument `params_argnum` (default 0:
`update(state, batch)`), read at its first call, when it is a pytree of arrays (a dict of parameters, a flax
TrainState, (params, opt_state)): `fleetprof.fingerprint.describe_pytree` over its leaves' key paths and shapes,
no optimizer (an optax update is a function, no class to name); `precision_mode` the dtype holding most of its
floating-point elements (bf16, fp32...). Batch size and backend do not enter it. `fleetprof_step(params=...)` hands the
same tree to the marker. Unknown (no fingerprint fields) for `fleetprof_step` without `params`, for
`params_argnum=None`, and when the argument is not a pytree of arrays (a leaf without a
shape, no leaf at all). What the argument holds is the program's choice: a TrainState with an Adam state is another
tree, hence another id, than the same parameters alone.
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
from agent.hooks.env import block_level, install_level
from agent.hooks.events import EventFactory, sample_count
from agent.hooks.fingerprint import JAX, ModelFingerprint
from agent.hooks.framework_info import host_memory_bytes
from agent.hooks.memory import RssPeak
from agent.hooks.sender import EventSender
from fleetprof.client import Client
from fleetprof.fingerprint import Precision, precision_of

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
        self._fingerprint: ModelFingerprint | None = None
        self._precision: Precision | None = None
        self._tree_read = False

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

    def step(self, samples: Any = None, wait: Any = None, params: Any = None) -> None:
        """End a training step (safe to call when disabled); `wait` is waited for first; `params` (the parameter
        pytree) is read for the fingerprint at the first step that gives it."""
        if not self.enabled:
            return
        try:
            if params is not None and not self._tree_read:
                self._read_tree(params)
            if wait is not None:
                self.jax.block_until_ready(wait)
            self._boundary(sample_count(samples) if samples is not None else None)
        except Exception as exc:
            self._fail(exc)

    def run_step(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 batch_argnum: int | None, params_argnum: int | None = 0) -> Any:
        """One call of a `@train_step` function: timed to its outputs' readiness."""
        if not self._tree_read and params_argnum is not None and len(args) > params_argnum:
            self._read_tree(args[params_argnum])  # before the call: a donated argument is gone after it
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

    def _read_tree(self, tree: Any) -> None:
        """The fingerprint of the step's parameter pytree, once (None when it is not a pytree of arrays)."""
        self._tree_read = True
        try:
            self._fingerprint = ModelFingerprint.of_pytree(self.jax, tree)
            self._precision = _majority_precision(self.jax.tree_util.tree_leaves(tree))
        except ValueError as exc:
            log.info("fleetprof hooks: no fingerprint for the train step's argument: %s", exc)
        except Exception as exc:  # an object the walk cannot read: unknown, the steps still count
            log.info("fleetprof hooks: no fingerprint for the train step's argument: %r", exc)

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
        info: dict[str, Any] = {"device": self.device, "framework": JAX,
                                "framework_version": str(getattr(self.jax, "__version__", ""))[:100] or None}
        if self._fingerprint is not None:
            info.update(self._fingerprint.fields(optimizers=[], precision_mode=self._precision),
                        parameter_count=self._fingerprint.parameter_count)
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


def train_step(fn: F | None = None, *, batch_argnum: int | None = 1, params_argnum: int | None = 0) -> Any:
    """Decorator: each call of `fn` is one training step (see the module docstring). Usable bare or with
    `batch_argnum=` (None: samples unknown) and `params_argnum=` (the parameter pytree; None: no fingerprint)."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            prof = _current
            if prof is None or not prof.enabled:
                return f(*args, **kwargs)
            return prof.run_step(f, args, kwargs, batch_argnum, params_argnum)

        return wrapper  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap


def _majority_precision(leaves: list[Any]) -> Precision | None:
    """The dtype holding most floating-point elements of the leaves, as a precision (None: no float leaf)."""
    elements: dict[str, int] = {}
    for leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        # bfloat16 and the float8s are ml_dtypes' extension types, of numpy kind "V": named, not kinded
        if dtype is None or not (getattr(dtype, "kind", None) == "f" or str(dtype).startswith(("bfloat", "float"))):
            continue
        n = 1
        for d in getattr(leaf, "shape", ()):
            n *= int(d)
        elements[str(dtype)] = elements.get(str(dtype), 0) + n
    if not elements:
        return None
    return precision_of(autocast_dtype=None, parameter_dtype=max(elements, key=lambda k: elements[k]))


def step(samples: Any = None, wait: Any = None, params: Any = None) -> None:
    """End a JAX training step; a no-op without hooks."""
    prof = _current
    if prof is not None:
        prof.step(samples, wait, params)


def install(settings: AgentSettings | None = None, *, transport: Client | None = None) -> JaxProfiler | None:
    """Install the JAX hooks in this process once (idempotent); None when off or not configured."""
    global _current
    with _install_lock:
        if _current is not None:
            return _current
        settings = settings or AgentSettings()
        if install_level(settings, can_send=bool(settings.server_url or transport)) is None or not settings.job_id:
            return None
        import jax

        transport = transport or Client(settings.server_url or "", settings.token, timeout_s=5.0)
        prof = JaxProfiler(jax, job_id=settings.job_id, sender=EventSender(transport))
        _current = prof.install()
        return prof


def install_block(jax: Any, job_id: str, transport: Client,
                  settings: AgentSettings | None = None) -> JaxProfiler | None:
    """The JAX hooks for a `fleetprof.profile()` block (the `jax` module the process already imported): its
    `@train_step` functions and `fleetprof_step` marks count, sending to `transport` through a sender of its own.
    None when the hooks are off, or when this process is already profiled."""
    global _current
    settings = settings or AgentSettings()
    if block_level(settings) is None:
        return None
    with _install_lock:
        if _current is not None:
            log.info("fleetprof hooks: JAX is already profiled in this process; the block adds no hooks")
            return None
        prof = JaxProfiler(jax, job_id=job_id, sender=EventSender(transport))
        _current = prof.install(process_hooks=False)
        return prof


def uninstall(prof: JaxProfiler, *, timeout_s: float = 30.0) -> None:
    """End a block's JAX hooks: the last framework_info sent, events flushed (waiting at most `timeout_s`)."""
    global _current
    try:
        prof.close(timeout_s)
    finally:
        with _install_lock:
            if _current is prof:
                _current = None
