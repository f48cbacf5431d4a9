"""Keras 3 instrumentation (any backend: TensorFlow, JAX, PyTorch): a callback injected into every `Model.fit`.

Installed with no change to the user's script by the `sitecustomize` that `fleetprof run` puts on the child's path,
once the script has imported keras (`import keras`, or `tf.keras`, which is Keras 3 from TensorFlow 2.16 on); or
explicitly with `install()`. It sends the events the PyTorch hooks send (fleetprof.protocol: job_start, step, layer,
framework_info), with `framework` = "keras <version> (<backend> backend)".

Step rule (documented contract):
  * One step per train batch, which is one optimizer step (`on_train_batch_end`). With `steps_per_execution=k`
    Keras calls the batch callbacks once per k batches: those k steps are sent, each with 1/k of the execution's
    time (averaged, since no clock sees the batches inside one execution); an epoch's last execution counts the
    batches left (the epoch's size from the data adapter; unknown size: k).
  * A step's wall time runs from the previous step's end to this one (the iteration period: the next batch's
    fetch included, as in the PyTorch hooks); the first step of each epoch starts at the epoch's start, so that
    validation and the epoch's other callbacks between two epochs fall in no step.
  * The callback is not `async_safe`: Keras then hands each batch's logs to the callbacks on the training thread
    (as it does whenever a user callback is not async-safe), so a step's time is its device work, not only its
    dispatch.
  * `samples` = the batch size of Keras's data adapter (the last, partial batch of an epoch counted as it is);
    unknown (null) where the adapter does not know it (a generator, an unbatched dataset).
Per-layer time, every `layer_every`-th step (steps 1, 1+N, ...): on the torch backend Keras layers are
`torch.nn.Module`s, timed (forward and backward) by `agent.hooks.layers.LayerSampler` under their Keras names
(dotted paths from the model, the model named after its type); on TensorFlow and JAX the train step is one
compiled program in which no layer has a time of its own: the layers are sent with their names and types and
unknown (null) times. Per-layer time there comes from a profiler trace (`fleetprof import-trace`).
Memory per step: `memory.StepMemory` on torch (CUDA allocator or RSS), `device_memory.TfMemory` and `JaxMemory`.
Fingerprint (framework_info, from the first step on): `fleetprof.fingerprint.describe_keras_model` over the
model's layer tree (layer types, trainable weights' shapes) and the optimizer's class (inside a LossScaleOptimizer),
`framework` "keras"; `precision_mode` from the model's dtype policy (mixed_float16 -> amp_fp16, mixed_bfloat16 ->
amp_bf16, float32 -> fp32). The same model has the same id on every backend and at every batch size.
Every hook body is guarded: an error inside the instrumentation is logged once and the hooks switch off.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import inspect
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from agent.config import AgentSettings
from agent.hooks.device_memory import JaxMemory, TfMemory
from agent.hooks.env import LEVELS, block_level, install_level, layer_every
from agent.hooks.events import EventFactory
from agent.hooks.fingerprint import ModelFingerprint, keras_optimizer_name, keras_precision
from agent.hooks.framework_info import host_memory_bytes
from agent.hooks.memory import RssPeak, StepMemory
from agent.hooks.sender import EventSender
from fleetprof.client import Client

log = logging.getLogger(__name__)


_current: KerasProfiler | None = None
_install_lock = threading.Lock()


def current() -> KerasProfiler | None:
    """The Keras profiler installed in this process, if any."""
    return _current


def layer_names(model: Any) -> dict[int, tuple[str, str]]:
    """Every layer of `model` by id: (name, type). The model is named after its type; its layers by their Keras
    names, nested layers as dotted paths (`block.conv`), a dot inside a Keras name written `_`."""
    root_type = type(model).__name__
    out: dict[int, tuple[str, str]] = {id(model): (root_type, root_type)}

    def walk(layer: Any, prefix: str, depth: int) -> None:
        children = getattr(layer, "layers", None) if depth == 0 else getattr(layer, "_layers", None)
        for child in children or ():
            if id(child) in out or type(child).__name__ == "InputLayer":
                continue
            name = prefix + str(getattr(child, "name", type(child).__name__)).replace(".", "_")
            out[id(child)] = (name, type(child).__name__)
            if depth < 16:
                walk(child, name + ".", depth + 1)

    walk(model, "", 0)
    return out


class KerasProfiler:
    """Turns the train batches of every `Model.fit` into StepEvents, and sampled steps into LayerEvents."""

    def __init__(self, keras: Any, *, job_id: str, sender: EventSender, level: str = "default",
                 layer_every: int = 100, rss: RssPeak | None = None,
                 clock: Callable[[], float] = time.time, perf: Callable[[], float] = time.perf_counter):
        if level not in LEVELS:
            raise ValueError(f"hooks level {level!r} is not one of {LEVELS}")
        self.keras = keras
        self.backend = str(keras.backend.backend())
        self.sender = sender
        self.level = level
        self.layer_every = max(1, layer_every)
        self._perf = perf
        rss = rss or RssPeak()
        self._torch: Any = sys.modules.get("torch") if self.backend == "torch" else None
        self._mem_torch = StepMemory(self._torch, rss) if self.backend == "torch" else None
        self._mem_tf = TfMemory(sys.modules["tensorflow"], rss) if self.backend == "tensorflow" else None
        self._mem_jax = JaxMemory(sys.modules["jax"], rss) if self.backend == "jax" else None
        self._mem_other = StepMemory(None, rss) if self.backend not in ("torch", "tensorflow", "jax") else None
        self.device = self._device_name()
        framework = f"keras {keras.__version__} ({self.backend} backend)"
        # torch backend: the rank from torch.distributed, as the PyTorch hooks read it
        self._events = EventFactory(self._torch, job_id, clock, framework=framework, device=self.device,
                                    rank=_rank(self.backend))
        self.enabled = False
        self._failed = False
        self.steps_done = 0
        self._originals: list[tuple[Any, str, Any]] = []
        # the fit under way
        self._model: weakref.ref[Any] | None = None
        self._iterator: Any = None  # the training EpochIterator of the fit under way (its data adapter)
        self._fitting = 0
        self._step_start: float | None = None
        self._begin_batch = 0
        self._sampler: Any = None  # agent.hooks.layers.LayerSampler on the torch backend
        self._sampling = False
        self._batch_size: int | None = None
        self._num_batches: int | None = None
        self._partial: int | None = None
        self._adapter_batches: int | None = None
        self._info_sent: dict[str, Any] | None = None
        self._pending_steps: list[dict[str, Any]] = []
        self._layer_names: dict[int, tuple[str, str]] = {}
        self._fingerprint: tuple[int, ModelFingerprint | None] | None = None  # (id of the model, its fingerprint)

    # ------------------------------------------------------------------ install / teardown

    def install(self, *, send_job_start: bool = True, process_hooks: bool = True) -> KerasProfiler:
        if self.level == "off":
            return self
        self._patch_fit()
        try:
            self._patch_epoch_iterator()
        except Exception as exc:  # another Keras layout: steps and times still, samples unknown
            log.info("fleetprof hooks: Keras's EpochIterator not watched (%r); samples unknown", exc)
        self.enabled = True
        if process_hooks:
            atexit.register(self.close)
        if send_job_start:
            self.sender.put(self._events.job_start())
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        if self.enabled and self.steps_done:
            try:
                self._send_info()
            except Exception as exc:
                self._fail(exc)
        if self._sampler is not None:
            self._sampler.stop()
        for owner, attr, original in reversed(self._originals):
            _restore(owner, attr, original)
        self._originals.clear()
        self.enabled = False
        self.sender.close(timeout_s)

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            log.warning("fleetprof hooks: disabled after an internal error: %r", exc, exc_info=exc)
        self.enabled = False
        if self._sampler is not None:
            self._sampler.stop()

    def _patch_fit(self) -> None:
        model_cls = self.keras.Model
        original = model_cls.fit
        params = list(inspect.signature(original).parameters)
        position = params.index("callbacks") if "callbacks" in params else None  # `self` counted
        prof = self

        @functools.wraps(original)
        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if not prof.enabled:
                return original(model, *args, **kwargs)
            try:
                args, kwargs = prof._with_callback(model, position, args, kwargs)
            except Exception as exc:
                prof._fail(exc)
                return original(model, *args, **kwargs)
            prof._fitting += 1
            _stand_down_torch()
            try:
                return original(model, *args, **kwargs)
            finally:
                prof._fitting -= 1
                prof._iterator = None

        # keras.Model inherits fit from its backend's trainer: restoring it then deletes ours
        own = model_cls.__dict__.get("fit")
        self._originals.append((model_cls, "fit", own if own is not None else _Inherited()))
        model_cls.fit = fit

    def _patch_epoch_iterator(self) -> None:
        """The first EpochIterator made inside fit is its training data (Keras makes validation's later)."""
        # a private module: Keras 3 has kept it since 3.0, and a Keras without it only loses `samples`
        cls = importlib.import_module("keras.src.trainers.epoch_iterator").EpochIterator
        original = cls.__init__
        prof = self

        @functools.wraps(original)
        def __init__(it: Any, *args: Any, **kwargs: Any) -> None:
            original(it, *args, **kwargs)
            if prof._fitting and prof._iterator is None:
                prof._iterator = it

        self._originals.append((cls, "__init__", original))
        cls.__init__ = __init__

    def _with_callback(self, model: Any, position: int | None, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        cb = make_callback(self.keras, self, model)
        if position is not None and len(args) >= position:  # callbacks given positionally (args has no self)
            args = list(args)  # type: ignore[assignment]
            args[position - 1] = _add(args[position - 1], cb)  # type: ignore[index]
            return tuple(args), kwargs
        kwargs = dict(kwargs)
        kwargs["callbacks"] = _add(kwargs.get("callbacks"), cb)
        return args, kwargs

    # ------------------------------------------------------------------ callback bodies (training thread)

    def on_train_begin(self, model: Any) -> None:
        self._model = weakref.ref(model)
        self._batch_size = _adapter_attr(self._iterator, "batch_size")
        self._num_batches = _int_attr(self._iterator, "num_batches")  # steps per epoch (None: unknown)
        self._partial = _adapter_attr(self._iterator, "partial_batch_size")
        self._adapter_batches = _adapter_attr(self._iterator, "num_batches")  # the data's batches (its last partial)

    def on_epoch_begin(self) -> None:
        self._step_start = self._perf()

    def on_epoch_end(self) -> None:
        self._step_start = None
        self._stop_sampling()

    def on_train_batch_begin(self, batch: int) -> None:
        if self._step_start is None:
            self._step_start = self._perf()
        self._begin_batch = batch
        if (self.steps_done - 1) % self.layer_every == 0 and self.steps_done >= 1 and not self._sampling:
            self._start_sampling()

    def on_train_batch_end(self, batch: int) -> None:
        start = self._step_start if self._step_start is not None else self._perf()
        n = max(1, batch - self._begin_batch + 1)
        # Keras reports an execution's last batch as begin + k - 1 even when the epoch ran out before it
        num = self._num_batches
        if num is not None and num > self._begin_batch:
            n = min(n, num - self._begin_batch)
        first = self.steps_done
        for i in range(n):
            ev = self._events.step(first + i, self._samples(self._begin_batch + i))
            if i == n - 1:
                self._memory(ev, first + i, start)
            self._pending_steps.append(ev)
        layers = self._finish_sampling(first + n - 1) if self._sampling else []
        self.steps_done = done = first + n
        if done.bit_length() != first.bit_length():  # a power of two passed: steps 1, 2, 4, 8, ...
            self._send_info()
        # the step ends after our own bookkeeping (its cost lands in the step that paid it)
        now = self._perf()
        wall = max(0.0, now - start) / n
        for ev in self._pending_steps:
            ev["wall_s"] = wall
            self.sender.put(ev)
        self._pending_steps.clear()
        for layer in layers:
            self.sender.put(layer)
        self._step_start = now

    # ------------------------------------------------------------------ pieces

    def _samples(self, index: int) -> int | None:
        size = self._batch_size
        if size is None:
            return None
        num, partial = self._adapter_batches, self._partial
        if partial and num is not None and index % num == num - 1:
            return partial
        return size

    def _memory(self, ev: dict[str, Any], step: int, start: float) -> None:
        if self._mem_torch is not None:
            torch = self._torch
            cuda = bool(torch is not None and torch.cuda.is_initialized())
            self._mem_torch.add(ev, cuda=cuda, step=step, step_start=start)
        elif self._mem_tf is not None:
            self._mem_tf.add(ev, step=step, step_start=start)
        elif self._mem_jax is not None:
            self._mem_jax.add(ev, step=step, step_start=start)
        elif self._mem_other is not None:
            self._mem_other.add(ev, cuda=False, step=step, step_start=start)

    def _start_sampling(self) -> None:
        model = self._model() if self._model is not None else None
        if model is None:
            return
        self._sampling = True
        self._layer_names = layer_names(model)
        if self.backend == "torch" and self._torch is not None:
            from agent.hooks.layers import LayerSampler

            if self._sampler is None:
                self._sampler = LayerSampler(self._torch, on_error=self._fail)
            cuda = bool(self._torch.cuda.is_initialized())
            self._sampler.start(model, cuda=cuda, names={k: v[0] for k, v in self._layer_names.items()})

    def _stop_sampling(self) -> None:
        if self._sampler is not None and self._sampler.active:
            self._sampler.stop()
        self._sampling = False

    def _finish_sampling(self, step: int) -> list[dict[str, Any]]:
        self._sampling = False
        if self._sampler is not None and self._sampler.active:
            rows = self._sampler.finish()
        else:  # a compiled step (TensorFlow, JAX): names and types, times unknown
            rows = [{"module": name[:500], "module_type": kind[:200], "calls": 1}
                    for name, kind in self._layer_names.values()]
        out = []
        for fields in rows:
            layer = self._events.base("layer")
            layer.update(step=step, **fields)
            out.append(layer)
        return out

    def _device_name(self) -> str:
        try:
            if self.backend == "torch" and self._torch is not None:
                return "cuda" if self._torch.cuda.is_available() else "cpu"
            if self.backend == "tensorflow":
                return "gpu:0" if self._mem_tf is not None and self._mem_tf.device else "cpu"
            if self.backend == "jax":
                return str(sys.modules["jax"].local_devices()[0].platform)
        except Exception as exc:
            log.info("fleetprof hooks: device unknown: %r", exc)
        return "cpu"

    def _send_info(self) -> None:
        fields = self._info()
        if fields != self._info_sent:
            self._info_sent = fields
            ev = self._events.base("framework_info")
            ev.update({k: v for k, v in fields.items() if v is not None})
            self.sender.put(ev)

    def _info(self) -> dict[str, Any]:
        model = self._model() if self._model is not None else None
        info: dict[str, Any] = {"device": self.device}
        if self._batch_size is not None and self._batch_size >= 1:
            info.update(batch_size=int(self._batch_size), batch_size_source="dataloader")
        if model is not None:
            cls = type(model)
            info["model_class"] = f"{cls.__module__}.{cls.__qualname__}"[:500]
            with contextlib.suppress(Exception):  # an unbuilt model: unknown
                info["parameter_count"] = int(model.count_params())
            opt = getattr(model, "optimizer", None)
            optimizers = [keras_optimizer_name(opt)] if opt is not None else []
            if optimizers:
                info["optimizers"] = optimizers
            policy = getattr(model, "dtype_policy", None)
            compute, variable = getattr(policy, "compute_dtype", None), getattr(policy, "variable_dtype", None)
            if compute:
                info["precision"] = str(compute)[:50]
                # a mixed policy (compute float16, variables float32) is Keras's autocast
                info["precision_source"] = "autocast" if variable and variable != compute else "parameters"
            fingerprint = self._model_fingerprint(model)
            if fingerprint is not None:
                info.update(fingerprint.fields(optimizers=optimizers, precision_mode=keras_precision(policy)))
        if self.device == "cpu":
            total = host_memory_bytes()
            info.update(device_memory_total_bytes=total, device_memory_source="host_memory" if total else None)
        return info


    def _model_fingerprint(self, model: Any) -> ModelFingerprint | None:
        """The model's fingerprint, walked once per model (the same rule as PyTorch's, fleetprof.fingerprint)."""
        if self._fingerprint is None or self._fingerprint[0] != id(model):
            try:
                fingerprint: ModelFingerprint | None = ModelFingerprint.of_keras(self.keras, model)
            except Exception:  # a layer the walk cannot read: no fingerprint, the rest still reports
                log.warning("fleetprof hooks: no fingerprint for %s", type(model).__name__, exc_info=True)
                fingerprint = None
            self._fingerprint = (id(model), fingerprint)
        return self._fingerprint[1]


class _Inherited:
    """Marks an attribute the class inherited: restoring it deletes the class's own."""


def _restore(owner: Any, attr: str, original: Any) -> None:
    if isinstance(original, _Inherited):
        if attr in owner.__dict__:
            delattr(owner, attr)
    else:
        setattr(owner, attr, original)


def _add(callbacks: Any, cb: Any) -> Any:
    if callbacks is None:
        return [cb]
    if isinstance(callbacks, (list, tuple)):
        return [*callbacks, cb]
    append = getattr(callbacks, "append", None)  # a keras CallbackList
    if append is not None:
        append(cb)
        return callbacks
    return [callbacks, cb]


def _int_attr(obj: Any, name: str) -> int | None:
    try:
        value = getattr(obj, name)
    except Exception:  # an object that cannot tell
        return None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _adapter_attr(iterator: Any, name: str) -> int | None:
    try:
        value = getattr(iterator.data_adapter, name)
    except Exception:  # no iterator, or an adapter that cannot tell
        return None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _rank(backend: str) -> int:
    try:
        if backend == "jax":
            return int(sys.modules["jax"].process_index())
    except Exception:
        pass
    return 0


def make_callback(keras: Any, prof: KerasProfiler, model: Any) -> Any:
    """A `keras.callbacks.Callback` that hands each event to `prof`, every body guarded."""

    class FleetprofCallback(keras.callbacks.Callback):
        async_safe = False  # see the module docstring: timing needs the training thread

        def _guard(self, fn: Callable[..., None], *args: Any) -> None:
            if not prof.enabled:
                return
            try:
                fn(*args)
            except Exception as exc:
                prof._fail(exc)

        def on_train_begin(self, logs: Any = None) -> None:
            self._guard(prof.on_train_begin, model)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._guard(prof.on_epoch_begin)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._guard(prof.on_epoch_end)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._guard(prof.on_train_batch_begin, batch)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._guard(prof.on_train_batch_end, batch)

    return FleetprofCallback()


def _torch_profiler() -> Any:
    mod = sys.modules.get("agent.hooks.torch")
    return mod.current() if mod is not None else None


def _stand_down_torch() -> None:
    """In `Model.fit` the steps are Keras's: the PyTorch hooks (torch backend) remove theirs (their module hooks
    would time every layer call of the fit, and no torch optimizer steps there). Their sender stays: it is ours too."""
    prof = _torch_profiler()
    if prof is not None and prof.enabled:
        prof.stand_down()


def install(settings: AgentSettings | None = None, *, transport: Client | None = None) -> KerasProfiler | None:
    """Install the Keras hooks in this process once (idempotent); None when off or not configured."""
    global _current
    with _install_lock:
        if _current is not None:
            return _current
        keras = importlib.import_module("keras")  # the job's own, already imported (sitecustomize)
        settings = settings or AgentSettings()
        level = install_level(settings, can_send=bool(settings.server_url or transport))
        if level is None or settings.job_id is None:
            return None
        torch_prof = _torch_profiler()  # one sender for the process: the PyTorch hooks' when they came first
        sender = torch_prof.sender if torch_prof is not None else None
        if sender is None:
            transport = transport or Client(settings.server_url or "", settings.token, timeout_s=5.0)
            sender = EventSender(transport)
        prof = KerasProfiler(keras, job_id=settings.job_id, sender=sender, level=level,
                             layer_every=layer_every(level, settings))
        import multiprocessing

        prof.install(send_job_start=multiprocessing.parent_process() is None)
        _current = prof
        return prof


def install_block(keras: Any, job_id: str, transport: Client,
                  settings: AgentSettings | None = None) -> KerasProfiler | None:
    """The Keras hooks for a `fleetprof.profile()` block (the `keras` module the process already imported): what
    `install` sets up, sending to `transport` through a sender of its own, without the process hooks (`uninstall`
    ends them). None when the hooks are off, or when this process is already profiled (`fleetprof run`, an
    enclosing block)."""
    global _current
    settings = settings or AgentSettings()
    level = block_level(settings)
    if level is None:
        return None
    with _install_lock:
        if _current is not None:
            log.info("fleetprof hooks: Keras is already profiled in this process; the block adds no hooks")
            return None
        prof = KerasProfiler(keras, job_id=job_id, sender=EventSender(transport), level=level,
                             layer_every=layer_every(level, settings))
        prof.install(process_hooks=False)
        _current = prof
        return prof


def uninstall(prof: KerasProfiler, *, timeout_s: float = 30.0) -> None:
    """End a block's Keras hooks: `fit` restored, events flushed (waiting at most `timeout_s`)."""
    global _current
    try:
        prof.close(timeout_s)
    finally:
        with _install_lock:
            if _current is prof:
                _current = None
