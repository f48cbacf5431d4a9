"""PyTorch instrumentation: steps, allocator peaks, per-module timing, allocator trace, OOM.

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
import gzip
import json
import logging
import operator
import os
import re
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
from agent.hooks.layers import LayerSampler, iter_tensors
from agent.hooks.memory import RssPeak, cuda_peaks_and_reset
from agent.hooks.sender import EventSender
from agent.transport import Transport
from fleetprof.jobid import job_path

snapshot_to_json: Callable[..., dict[str, Any]] | None
try:  # written by the imports engineer; optional here
    from agent.snapshot import snapshot_to_json  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    snapshot_to_json = None

log = logging.getLogger(__name__)

LEVELS = ("off", "default", "layers")
_OOM_TYPES: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,)
_CUDA_PENDING_MAX = 64
_ALLOC_TRACE_MAX_ENTRIES = 200_000

_current: Profiler | None = None
_install_lock = threading.Lock()


def current() -> Profiler | None:
    """The profiler installed in this process, if any."""
    return _current


class Profiler:
    """Turns optimizer steps (or explicit `step()` calls) into StepEvents, and sampled steps into LayerEvents."""

    def __init__(self, *, job_id: str, sender: EventSender, level: str = "default", layer_every: int = 50,
                 alloc_trace_steps: int = 0, rss: RssPeak | None = None,
                 clock: Callable[[], float] = time.time, perf: Callable[[], float] = time.perf_counter):
        if level not in LEVELS:
            raise ValueError(f"hooks level {level!r} is not one of {LEVELS}")
        self.job_id = job_id
        self.sender = sender
        self.level = level
        self.layer_every = max(1, layer_every)
        self.alloc_trace_steps = max(0, alloc_trace_steps)
        self._rss = rss or RssPeak()
        self._clock = clock
        self._perf = perf
        self.enabled = False
        self.steps_done = 0
        self._handles: list[Any] = []
        self._opt_handle: Any = None
        self._lead_opt: weakref.ref[Any] | None = None
        self._explicit = False
        self._last_boundary_by_opt = False
        self._step_start: float | None = None
        self._samples: int | None = None
        self._forwards = 0
        self._rank = 0
        self._rank_known = False
        # discovery of the top-level model during the first step
        self._discovering = False
        self._depth = 0
        self._candidates: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._model: weakref.ref[Any] | None = None
        # CUDA
        self._cuda_start_ev: Any = None
        self._cuda_pending: list[tuple[dict[str, Any], Any, Any]] = []
        self._alloc_tracing = False
        self._sampler = LayerSampler(torch, on_error=self._fail)
        self._failed = False
        self._job_start_sent = False

    # ------------------------------------------------------------------ install / teardown

    def install(self, *, send_job_start: bool = True, process_hooks: bool = True) -> Profiler:
        """Register the global hooks; `process_hooks` adds atexit flush, OOM excepthook and fork guard."""
        if self.level == "off":
            return self
        self.enabled = True
        self._opt_handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._discovering = True
        self._handles.append(_mm.register_module_forward_pre_hook(self._discover_pre))
        self._handles.append(_mm.register_module_forward_hook(self._discover_post, always_call=True))
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
        if self._handles or self._sampler.active:
            self._remove_module_hooks()
        if self._opt_handle is not None:
            self._opt_handle.remove()  # never from inside a hook: the optimizer iterates its hooks live
            self._opt_handle = None
        self._drain_cuda(final=True)
        if self._alloc_tracing:
            self._stop_alloc_trace(upload=False)
        self.enabled = False
        self.sender.close(timeout_s)

    def _remove_module_hooks(self) -> None:
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
        self._discovering = False

    def _after_fork(self) -> None:
        # A forked child (DataLoader worker) is not the training loop: stay silent there.
        self.enabled = False
        self._discovering = False
        self.sender.forget_thread()

    # ------------------------------------------------------------------ events

    def _base(self, kind: str) -> dict[str, Any]:
        if not self._rank_known:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                self._rank = int(dist.get_rank())
                self._rank_known = True
        return {"kind": kind, "job_id": self.job_id, "ts": self._clock(), "rank": self._rank}

    def _send_job_start(self) -> None:
        self._job_start_sent = True
        ev = self._base("job_start")
        ev.update(host=_hostname(), pid=os.getpid(), framework=f"pytorch {torch.__version__}",
                  device=_device_name())
        self.sender.put(ev)

    def send_oom(self, exc: BaseException) -> None:
        ev = self._base("oom")
        msg = str(exc)
        ev.update(message=msg[:4000], requested_bytes=parse_requested_bytes(msg))
        self.sender.put(ev)

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
            if not self.enabled or self._explicit:
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
        if self._handles or self._sampler.active:
            self._remove_module_hooks()
            if self._alloc_tracing:
                self._stop_alloc_trace(upload=False)

    def _boundary(self) -> None:
        if self._step_start is None:
            self._step_start = self._perf()  # no forward seen: an empty first step, not a made-up one
        step = self.steps_done
        ev = self._base("step")
        ev.update(step=step, samples=self._samples)
        cuda = torch.cuda.is_initialized()
        start_ev, end_ev = self._cuda_start_ev, None
        if cuda:
            if start_ev is not None:
                end_ev = torch.cuda.Event(enable_timing=True)
                end_ev.record()
            ev["allocated_peak_bytes"], ev["reserved_peak_bytes"] = cuda_peaks_and_reset(torch)
            ev["memory_source"] = "cuda_allocator"
        else:
            rss = self._rss.read_and_reset()
            if rss is not None:
                # RSS is what the process holds, the CPU analogue of "reserved"; allocated is unknown.
                ev["reserved_peak_bytes"] = rss
                ev["memory_source"] = "cpu_rss"
        if not self._job_start_sent:
            self._send_job_start()
        if self._sampler.active:
            for fields in self._sampler.finish():
                layer = self._base("layer")
                layer.update(step=step, **fields)
                self.sender.put(layer)
        self._drain_cuda(final=False)

        # prepare the next step
        self.steps_done += 1
        self._samples = None
        self._forwards = 0
        self._last_boundary_by_opt = False
        self._depth = 0
        if self._discovering:
            self._end_discovery()
        self._cuda_start_ev = end_ev
        if cuda and end_ev is None:
            self._cuda_start_ev = torch.cuda.Event(enable_timing=True)
            self._cuda_start_ev.record()
        # Per-module timing on sampled steps only: every `layer_every`-th step at the default level (bounded
        # overhead), every step at level "layers" (install() sets layer_every=1).
        if self._is_sampled(self.steps_done) and self.enabled:
            model = self._model() if self._model is not None else None
            self._sampler.start(model, cuda=cuda)
        self._alloc_trace_tick(cuda)

        # The step ends after our own bookkeeping: the user's clock around optimizer.step() counts it too,
        # so the hooks' cost lands in the step that paid it rather than in the next one.
        now = self._perf()
        ev["wall_s"] = max(0.0, now - self._step_start)
        self._step_start = now
        if end_ev is not None:
            self._cuda_pending.append((ev, start_ev, end_ev))
        else:
            self.sender.put(ev)

    def _is_sampled(self, step: int) -> bool:
        """Steps 1, 1+N, 1+2N, ... (step 0 is warm-up and discovery)."""
        return step >= 1 and (step - 1) % self.layer_every == 0

    def _drain_cuda(self, *, final: bool) -> None:
        """Send the step events whose device-time events have completed (query, never synchronize)."""
        keep = []
        for ev, start, end in self._cuda_pending:
            if end.query():
                ev["device_s"] = max(0.0, start.elapsed_time(end) / 1000.0)
                self.sender.put(ev)
            elif final or len(self._cuda_pending) > _CUDA_PENDING_MAX:
                self.sender.put(ev)  # device time unknown: null, not a guess
            else:
                keep.append((ev, start, end))
        self._cuda_pending = keep

    # ------------------------------------------------------------------ model discovery (first step)

    def _discover_pre(self, module: Any, args: Any) -> None:
        try:
            if not self._discovering:
                return
            if self._depth == 0:
                self._on_top_level_forward(args, {})
                key = id(module)
                ref, calls = self._candidates.get(key, (weakref.ref(module), 0))
                self._candidates[key] = (ref, calls + 1)
                if calls + 1 >= 3:  # a loop without any step boundary: stop paying for global hooks
                    self._end_discovery()
                    return
            self._depth += 1
        except Exception as exc:
            self._fail(exc)

    def _discover_post(self, module: Any, args: Any, output: Any) -> None:
        if self._discovering and self._depth > 0:
            self._depth -= 1

    def _end_discovery(self) -> None:
        self._discovering = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        best, best_params = None, -1
        for ref, _calls in self._candidates.values():
            mod = ref()
            if mod is None:
                continue
            n = sum(p.numel() for p in mod.parameters())
            if n > best_params:
                best, best_params = mod, n
        self._candidates.clear()
        if best is not None:
            self._model = weakref.ref(best)
            self._handles.append(best.register_forward_pre_hook(self._model_pre, with_kwargs=True))

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
            if torch.cuda.is_initialized() and self._cuda_start_ev is None:
                self._cuda_start_ev = torch.cuda.Event(enable_timing=True)
                self._cuda_start_ev.record()
        if self._samples is None:
            self._samples = batch_size_of(args, kwargs)

    # ------------------------------------------------------------------ allocator trace (CUDA, opt-in)

    def _alloc_trace_tick(self, cuda: bool) -> None:
        """Trace steps 1..K: start at the end of step 0, stop and upload at the end of step K."""
        if not self.alloc_trace_steps:
            return
        if self.steps_done == 1:
            if not cuda:
                log.info("fleetprof hooks: allocator trace needs CUDA; skipped on this CPU-only run")
                return
            torch.cuda.memory._record_memory_history(max_entries=_ALLOC_TRACE_MAX_ENTRIES)
            self._alloc_tracing = True
        elif self._alloc_tracing and self.steps_done == 1 + self.alloc_trace_steps:
            self._stop_alloc_trace(upload=True)

    def _stop_alloc_trace(self, *, upload: bool) -> None:
        snapshot = torch.cuda.memory._snapshot() if upload else None
        torch.cuda.memory._record_memory_history(enabled=None)
        self._alloc_tracing = False
        if snapshot is None:
            return
        job_id, first, last, rank = self.job_id, 1, self.alloc_trace_steps, self._rank

        def upload_job(transport: Transport) -> None:
            if snapshot_to_json is None:  # agent.snapshot ships with the agent; guard for partial installs
                log.warning("fleetprof hooks: allocator trace captured but agent.snapshot is missing; "
                            "not uploaded")
                return
            # The "fleetprof.snapshot.v1" document, sent as `fleetprof import-trace` sends one (gzip).
            payload = snapshot_to_json(snapshot)
            body = gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), compresslevel=5)
            transport.request("POST", job_path(job_id, "traces"), raw_body=body,
                              content_type="application/gzip", compress=False,
                              params={"filename": f"hooks-alloc-trace-steps-{first}-{last}.json",
                                      "rank": str(rank)})

        self.sender.submit(upload_job)


# ---------------------------------------------------------------------- helpers


def sample_count(value: Any) -> int | None:
    """A caller's `step(samples=...)` as a plain int (numpy and torch integers too: the wire protocol takes JSON
    integers only and would drop the step's event); anything else (a float, a bool) is unknown."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def batch_size_of(args: Any, kwargs: Any) -> int | None:
    for obj in (args, kwargs):
        for t in iter_tensors(obj, torch):
            return int(t.shape[0]) if t.dim() >= 1 else None
    return None


_ALLOC_RE = re.compile(r"Tried to allocate ([0-9.]+) ?(bytes|B|KiB|MiB|GiB|TiB)")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_requested_bytes(message: str) -> int | None:
    """'CUDA out of memory. Tried to allocate 20.00 MiB ...' -> 20971520 (rounded as printed)."""
    m = _ALLOC_RE.search(message)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _device_name() -> str:
    if torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cuda" if torch.cuda.is_available() else "cpu"


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


def install(settings: AgentSettings | None = None, *, transport: Transport | None = None) -> Profiler | None:
    """Install the hooks in this process once (idempotent); None when off or not configured."""
    global _current
    with _install_lock:
        if _current is not None:
            return _current
        settings = settings or AgentSettings()
        level = settings.hooks_level
        if level == "off":
            return None
        if level not in LEVELS:
            log.warning("fleetprof hooks: unknown FLEETPROF_HOOKS_LEVEL=%r; using 'default'", level)
            level = "default"
        if not settings.job_id or not (settings.server_url or transport):
            log.info("fleetprof hooks: no job id or server URL; hooks not installed")
            return None
        transport = transport or Transport(settings.server_url or "", settings.token, timeout_s=5.0)
        prof = Profiler(job_id=settings.job_id, sender=EventSender(transport), level=level,
                        layer_every=1 if level == "layers" else settings.hooks_layer_every,
                        alloc_trace_steps=settings.hooks_alloc_trace_steps)
        # A multiprocessing child (DataLoader spawn worker, mp.spawn rank) announces itself only if it
        # takes a step, so idle workers stay silent.
        import multiprocessing

        prof.install(send_job_start=multiprocessing.parent_process() is None)
        _current = prof
        return prof
