"""PyTorch instrumentation: steps, allocator peaks, per-module timing, allocator and profiler traces, OOM, and what
right-sizing needs (batch size, model, optimizer, precision).

Installed with no change to the user's script by the `sitecustomize` that `fleetprof run` puts on the
child's path (see `agent.hooks.env.child_env`), once the script imports torch; or explicitly:

    from agent.hooks.torch import install
    prof = install()          # settings from FLEETPROF_* (job id, server URL, token, level)
    ...
    prof.step()               # only for loops without an optimizer

Step boundary rule (documented contract):
  * By default a step ends when the *lead optimizer* finishes `step()` (global optimizer post-hook).
    The lead is the first optimizer instance that steps; steps of any other optimizer (a GAN's second
    optimizer, a separate embedding optimizer) fall inside the current step and never end one, so
    several optimizers stepping in one iteration count one step. If the lead is garbage collected, the
    next optimizer that steps becomes the lead. Optimizers that step at different rates (WGAN's 5 critic
    steps per generator step) count the lead's steps: call `step()` explicitly there.
  * Once `Profiler.step()` / `agent.hooks.fleetprof_step()` is called, only explicit calls end steps. If
    the first explicit call comes right after an optimizer-made boundary (no model forward in between),
    the two are the same iteration and it is not counted twice.
  * A step's wall time runs from the previous boundary to this one (the iteration period, data loading
    included); the first step starts at the first forward of a top-level module.
  * `samples` = batch size (dim 0) of the first tensor passed to the model's first forward in the step.
    The model is the top-level module with the most parameters among those called in the first step.

Every hook body is guarded: an exception inside the instrumentation is logged once and the hooks switch
themselves off; the user's program carries on untouched.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as _mm
from torch.optim.optimizer import register_optimizer_step_post_hook

from agent.config import AgentSettings
from agent.hooks.alloc_trace import AllocTracer
from agent.hooks.capture import CaptureManager
from agent.hooks.device_time import DeviceTimer
from agent.hooks.discovery import ModelDiscovery
from agent.hooks.env import LEVELS, block_level, install_level, layer_every
from agent.hooks.events import EventFactory, sample_count
from agent.hooks.flops import StepFlops
from agent.hooks.framework_info import FrameworkInfo
from agent.hooks.layers import LayerSampler, iter_tensors
from agent.hooks.memory import RssPeak, StepMemory
from agent.hooks.profile_trace import ProfileTracer
from agent.hooks.sender import EventSender
from fleetprof.client import Client

log = logging.getLogger(__name__)

_OOM_TYPES: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,)

_current: Profiler | None = None
_install_lock = threading.Lock()


def current() -> Profiler | None:
    """The profiler installed in this process, if any."""
    return _current


class Profiler:
    """Turns optimizer steps (or explicit `step()` calls) into StepEvents, and sampled steps into LayerEvents.

    It keeps the step boundary rule and hands each concern to a collaborator: the model (`ModelDiscovery`),
    memory peaks (`memory.StepMemory`), device time (`DeviceTimer`), per-module timing (`LayerSampler`), the
    allocator trace (`AllocTracer`), the profiler trace (`ProfileTracer`), what right-sizing needs (batch size,
    model, optimizer, precision: `FrameworkInfo`), the events' common fields (`EventFactory`) and sending
    (`EventSender`).
    """

    def __init__(self, *, job_id: str, sender: EventSender, level: str = "default", layer_every: int = 50,
                 alloc_trace_steps: int = 0, profile_steps: int = 0, capture_poll_s: float = 0.0,
                 flop_count: bool = True, rss: RssPeak | None = None,
                 clock: Callable[[], float] = time.time, perf: Callable[[], float] = time.perf_counter):
        if level not in LEVELS:
            raise ValueError(f"hooks level {level!r} is not one of {LEVELS}")
        self.job_id = job_id
        self.sender = sender
        self.level = level
        self.layer_every = max(1, layer_every)
        self._rss = rss or RssPeak()
        self._memory = StepMemory(torch, self._rss)
        self._perf = perf
        self._cuda = False  # CUDA seen initialized (it stays so; a forked child switches the hooks off)
        self.enabled = False
        self.steps_done = 0
        self._failed = False
        self._job_start_sent = False
        # the step boundary rule
        self._opt_handle: Any = None
        self._lead_opt: weakref.ref[Any] | None = None
        self._explicit = False
        self._last_boundary_by_opt = False
        # the step under way
        self._step_start: float | None = None
        self._samples: int | None = None
        self._forwards = 0
        self._autocast_checks = 0  # first forwards checked for autocast (all of the first 16, then 1 in 16)
        # the model: found during the first step, then watched by one hook of its own
        self._model: weakref.ref[Any] | None = None
        self._handles: list[Any] = []
        self._discovery = ModelDiscovery(_mm, on_top_level_forward=lambda args: self._on_top_level_forward(args, {}),
                                         on_model=self._on_model, on_error=self._fail)
        self._events = EventFactory(torch, job_id, clock)
        self._device_time = DeviceTimer(torch, sender.put)
        self._cuda_initialized = torch.cuda.is_initialized
        self._sampler = LayerSampler(torch, on_error=self._fail)
        self._alloc_trace = AllocTracer(torch, sender, job_id=job_id, steps=alloc_trace_steps)
        self._profile_trace = ProfileTracer(torch, sender, job_id=job_id, steps=profile_steps)
        # Live capture requests: polled on a thread of their own from the end of step 0 (0 s = off).
        # (A stand-in sender without a transport, as in unit tests, cannot poll.)
        transport = getattr(sender, "transport", None)
        self._capture = CaptureManager(torch, sender, transport, job_id=job_id,
                                       poll_s=capture_poll_s if transport is not None else 0.0,
                                       rank=lambda: self._events.rank, other_trace_active=self._other_trace_active)
        self._info = FrameworkInfo(torch)
        self._info_sent: dict[str, Any] | None = None
        self._flops = StepFlops(torch, enabled=flop_count)  # one step's FLOPs (steps 1), for MFU

    # ------------------------------------------------------------------ install / teardown

    def install(self, *, send_job_start: bool = True, process_hooks: bool = True) -> Profiler:
        """Register the global hooks; `process_hooks` adds atexit flush, OOM excepthook and fork guard."""
        if self.level == "off":
            return self
        self.enabled = True
        self._opt_handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._discovery.start()
        try:
            self._info.patch_dataloader()
        except Exception as exc:  # an unusual torch build: the batch size then comes from the inputs alone
            log.info("fleetprof hooks: DataLoader batch_size not watched: %r", exc)
        if process_hooks:
            atexit.register(self.close)
            _chain_excepthook(self)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=self._after_fork)
        if send_job_start:
            self._send_job_start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush (atexit): finished CUDA timings, then the queue, waiting at most `timeout_s`."""
        self._remove_module_hooks()
        self._flops.close()
        if self._opt_handle is not None:
            self._opt_handle.remove()  # never from inside a hook: the optimizer iterates its hooks live
            self._opt_handle = None
        self._device_time.drain(final=True)
        if self._alloc_trace.active:
            self._alloc_trace.stop(upload=False, rank=self._events.rank)
        if self._profile_trace.active:
            self._profile_trace.stop(upload=False, rank=self._events.rank)
        self._capture.close(self._events.rank)
        if self.enabled and self.steps_done:
            try:
                self._send_info()
            except Exception as exc:
                self._fail(exc)
        self._info.unpatch_dataloader()
        self.enabled = False
        self.sender.close(timeout_s)

    def stand_down(self) -> EventSender:
        """Another framework's hooks take this process over (Keras on the torch backend, imported after torch):
        remove every hook, take no more steps, and hand over the sender (its queue and sequence go on)."""
        self._remove_module_hooks()
        if self._opt_handle is not None:
            self._opt_handle.remove()
            self._opt_handle = None
        self._info.unpatch_dataloader()
        self.enabled = False
        self._discovery.active = False
        return self.sender

    def _remove_module_hooks(self) -> None:
        self._discovery.remove_hooks()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._sampler.stop()

    def _fail(self, exc: BaseException) -> None:
        """Any error in the instrumentation: log once, switch off. Never raises into the user's code.

        Hooks are only flagged off here; they are unregistered at the next step boundary, because the
        optimizer iterates its global hook dict live and must not see it change under it.
        """
        if not self._failed:
            self._failed = True
            log.warning("fleetprof hooks: disabled after an internal error: %r", exc, exc_info=exc)
        self.enabled = False
        self._discovery.active = False

    def _after_fork(self) -> None:
        # A forked child (DataLoader worker) is not the training loop: stay silent there.
        self.enabled = False
        self._discovery.active = False
        self.sender.forget_thread()
        self._capture.forget_thread()

    # ------------------------------------------------------------------ events

    def _send_job_start(self) -> None:
        self._job_start_sent = True
        self.sender.put(self._events.job_start())

    def send_oom(self, exc: BaseException) -> None:
        self.sender.put(self._events.oom(exc))

    # ------------------------------------------------------------------ step boundaries

    def step(self, samples: int | None = None) -> None:
        """Explicit end of a training step (loops without an optimizer). Safe to call when disabled."""
        try:
            if not self.enabled:
                return
            first_explicit = not self._explicit
            self._explicit = True
            if samples is not None:
                self._samples = sample_count(samples)
            if first_explicit and self._last_boundary_by_opt and self._forwards == 0:
                return  # same iteration as the optimizer step that just ended it
            self._boundary()
        except Exception as exc:
            self._fail(exc)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self._failed:
                self._cleanup_after_failure()
                return
            if not self.enabled:
                return
            self._info.note_optimizer(optimizer)
            if self._explicit:
                return
            lead = self._lead_opt() if self._lead_opt is not None else None
            if lead is None:
                self._lead_opt = weakref.ref(optimizer)
                lead = optimizer
            if optimizer is lead:
                self._boundary()
                self._last_boundary_by_opt = True
        except Exception as exc:
            self._fail(exc)

    def _cleanup_after_failure(self) -> None:
        self._flops.close()
        if self._handles or self._discovery.handles or self._sampler.active:
            self._remove_module_hooks()
            if self._alloc_trace.active:
                self._alloc_trace.stop(upload=False, rank=self._events.rank)
            if self._profile_trace.active:
                self._profile_trace.stop(upload=False, rank=self._events.rank)
            self._capture.close(self._events.rank)

    def _boundary(self) -> None:
        # Runs once per training step on the training thread: every call and allocation here is paid per step
        # (see bench/hook_overhead.py), so the rare work sits behind plain attribute tests.
        start = self._step_start
        if start is None:
            start = self._step_start = self._perf()  # no forward seen: an empty first step, not a made-up one
        step = self.steps_done
        samples = self._samples
        ev = self._events.step(step, samples)
        cuda = self._cuda or self._check_cuda()
        device_time = self._device_time
        start_ev, end_ev = device_time.end_step(cuda=cuda) if cuda else (None, None)
        self._memory.add(ev, cuda=cuda, step=step, step_start=start)
        if not self._job_start_sent:
            self._send_job_start()
        if self._sampler.active:
            for fields in self._sampler.finish():
                layer = self._events.base("layer")
                layer.update(step=step, **fields)
                self.sender.put(layer)
        if device_time.pending:
            device_time.drain(final=False)

        # prepare the next step
        if samples is not None:
            self._info.note_step_samples(samples)
        self.steps_done = done = step + 1
        self._samples = None
        if not self._flops.done:  # the end of step 0 starts the count, the end of step 1 reads it
            self._flops.tick(done, other_trace_active=self._other_trace_active(),
                             model=self._model() if self._model is not None else None)
            self._info.flops_per_step = self._flops.flops_per_step
        self._forwards = 0
        self._last_boundary_by_opt = False
        if self._discovery.active:
            self._discovery.new_step()
            self._discovery.finish()
        if cuda:
            device_time.next_step(end_ev, cuda=cuda)
        # Per-module timing on sampled steps only: every `layer_every`-th step at the default level (bounded
        # overhead), every step at level "layers" (install() sets layer_every=1).
        # Steps 1, 1+N, 1+2N, ... (step 0 is warm-up and discovery).
        if (done - 1) % self.layer_every == 0 and self.enabled:
            model = self._model() if self._model is not None else None
            self._sampler.start(model, cuda=cuda)
        if self._alloc_trace.steps:
            self._alloc_trace.tick(done, cuda=cuda, rank=self._events.rank)
        if self._profile_trace.steps:
            self._profile_trace.tick(done, cuda=cuda, rank=self._events.rank)
        if self._capture.busy:  # a live capture request in hand (its errors are its own: reported, never _fail)
            self._capture.tick(done, cuda=cuda, rank=self._events.rank)
        if done & (done - 1) == 0:  # steps 1, 2, 4, 8, ...: sent when it changed
            self._send_info(cuda=cuda)
            if done == 1:
                self._capture.start()

        # The step ends after our own bookkeeping: the user's clock around optimizer.step() counts it too,
        # so the hooks' cost lands in the step that paid it rather than in the next one.
        now = self._perf()
        ev["wall_s"] = max(0.0, now - start)
        self._step_start = now
        if end_ev is None:
            self.sender.put(ev)
        else:
            device_time.send(ev, start_ev, end_ev)

    def _other_trace_active(self) -> bool:
        return self._profile_trace.active or self._alloc_trace.active

    def _check_cuda(self) -> bool:
        self._cuda = bool(self._cuda_initialized())
        return self._cuda

    def _send_info(self, *, cuda: bool | None = None) -> None:
        """The `framework_info` event, when its fields differ from the last one sent."""
        fields = self._info.info(cuda=torch.cuda.is_initialized() if cuda is None else cuda)
        if fields != self._info_sent:
            self._info_sent = fields
            ev = self._events.base("framework_info")
            ev.update({k: v for k, v in fields.items() if v is not None})
            self.sender.put(ev)

    # ------------------------------------------------------------------ the model's forwards

    def _on_model(self, model: Any) -> None:
        self._model = weakref.ref(model)
        self._info.note_model(model)
        self._handles.append(model.register_forward_pre_hook(self._model_pre, with_kwargs=True))

    def _model_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.enabled:
                self._on_top_level_forward(args, kwargs)
        except Exception as exc:
            self._fail(exc)

    def _on_top_level_forward(self, args: Any, kwargs: Any) -> None:
        self._forwards += 1
        if self._step_start is None:
            self._step_start = self._perf()
            self._device_time.first_forward()
        if self._samples is None:
            # the common case first: a batch tensor as the first positional argument
            first = args[0] if args else None
            if isinstance(first, torch.Tensor):
                self._samples = int(first.shape[0]) if first.dim() >= 1 else None
            else:
                self._samples = batch_size_of(args, kwargs)
            # Autocast (precision) on the first forward of each of the first 16 steps, then of 1 step in 16: the
            # framework_info event that reports it goes out at steps 1, 2, 4, 8, ... and at exit.
            checks = self._autocast_checks
            self._autocast_checks = checks + 1
            if checks < 16 or checks & 15 == 0:
                self._info.note_forward()


# ---------------------------------------------------------------------- helpers


def batch_size_of(args: Any, kwargs: Any) -> int | None:
    for obj in (args, kwargs):
        for t in iter_tensors(obj, torch):
            return int(t.shape[0]) if t.dim() >= 1 else None
    return None


def _chain_excepthook(prof: Profiler) -> None:
    """Report an OutOfMemoryError that ends the program, then hand over to the previous excepthook."""
    previous = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            if isinstance(value, _OOM_TYPES) and prof.enabled:
                prof.send_oom(value)
        except Exception:
            pass
        previous(tp, value, tb)

    sys.excepthook = excepthook


def install(settings: AgentSettings | None = None, *, transport: Client | None = None,
            announce: bool = True) -> Profiler | None:
    """Install the hooks in this process once (idempotent); None when off or not configured. `announce=False`: the
    job_start waits for the first step (torch imported by Keras, whose hooks announce the job)."""
    global _current
    with _install_lock:
        if _current is not None:
            return _current
        settings = settings or AgentSettings()
        level = install_level(settings, can_send=bool(settings.server_url or transport))
        if level is None or settings.job_id is None:
            return None
        transport = transport or Client(settings.server_url or "", settings.token, timeout_s=5.0)
        prof = Profiler(job_id=settings.job_id, sender=EventSender(transport), level=level,
                        layer_every=layer_every(level, settings),
                        alloc_trace_steps=settings.hooks_alloc_trace_steps,
                        profile_steps=settings.hooks_profile_steps,
                        capture_poll_s=settings.hooks_capture_poll_s, flop_count=settings.hooks_flop_count)
        # A multiprocessing child (DataLoader spawn worker, mp.spawn rank) announces itself only if it
        # takes a step, so idle workers stay silent.
        import multiprocessing

        prof.install(send_job_start=announce and multiprocessing.parent_process() is None)
        _current = prof
        return prof


def install_block(job_id: str, transport: Client, settings: AgentSettings | None = None) -> Profiler | None:
    """The hooks for a `fleetprof.profile()` block: what `install` sets up, sending to `transport`, without the
    process hooks (the block ends them itself: `uninstall`). None when the hooks are off, or when this process is
    already profiled (`fleetprof run`, an enclosing block): its profiler keeps counting the steps."""
    global _current
    settings = settings or AgentSettings()
    level = block_level(settings)
    if level is None:
        return None
    with _install_lock:
        if _current is not None:
            log.info("fleetprof hooks: this process is already profiled as job %r; the block adds none",
                     _current.job_id)
            return None
        prof = Profiler(job_id=job_id, sender=EventSender(transport), level=level,
                        layer_every=layer_every(level, settings),
                        alloc_trace_steps=settings.hooks_alloc_trace_steps,
                        profile_steps=settings.hooks_profile_steps,
                        capture_poll_s=settings.hooks_capture_poll_s, flop_count=settings.hooks_flop_count)
        prof.install(process_hooks=False)
        _current = prof
        return prof


def uninstall(prof: Profiler, *, exc: BaseException | None = None, timeout_s: float = 30.0) -> None:
    """End a block's hooks: report an out-of-memory error that ended it, flush (waiting at most `timeout_s`)."""
    global _current
    try:
        if isinstance(exc, _OOM_TYPES) and prof.enabled:
            prof.send_oom(exc)
        prof.close(timeout_s)
    finally:
        with _install_lock:
            if _current is prof:
                _current = None
