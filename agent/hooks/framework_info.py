"""What right-sizing needs to know about a training job, read from inside it with no change to its code.

Batch size, model class and parameter count, optimizer type(s), compute precision (autocast seen, in which
dtype) and the memory the run is measured against. Collected from what the Profiler already sees (the model's
first input of each step, the lead optimizer's steps, the model found in the first step) plus one wrapper on
`DataLoader.__iter__` that notes the loader's `batch_size`; everything on the training thread is a dict or set
update. `info()` builds the `framework_info` event's fields, sent by the Profiler when they change.

Batch-size rule: the commonest leading dimension of the model's first input over the steps (a last, short
batch does not count against it); when a DataLoader iterated in the job has that batch_size, the source is
"dataloader", else "forward_input". With no tensor input seen, a DataLoader's batch_size (the first one seen).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
from typing import Any

from agent.hooks.fingerprint import FRAMEWORK, ModelFingerprint
from fleetprof.fingerprint import model_class

log = logging.getLogger(__name__)


def host_memory_bytes() -> int | None:
    """Physical memory of this host (the capacity a CPU-only run's RSS is measured against)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


class FrameworkInfo:
    def __init__(self, torch: Any):
        self._torch = torch
        self._leading_dims: collections.Counter[int] = collections.Counter()
        self._loader_batch_sizes: dict[int, None] = {}  # insertion-ordered set
        self._optimizers: dict[str, None] = {}
        self._model_class: str | None = None
        self._parameter_count: int | None = None
        self._parameter_dtype: str | None = None
        self._autocast_dtype: str | None = None
        self._patched: tuple[Any, Any] | None = None  # (DataLoader class, its original __iter__)
        self._fingerprint: ModelFingerprint | None = None
        self.flops_per_step: int | None = None  # one step's FLOPs (agent.hooks.flops), None: not counted

    # ------------------------------------------------------------------ what the Profiler feeds in

    def note_step_samples(self, samples: int | None) -> None:
        if samples is not None and samples > 0:
            self._leading_dims[samples] += 1

    def note_optimizer(self, optimizer: Any) -> None:
        name = type(optimizer).__name__
        if name not in self._optimizers and len(self._optimizers) < 20:
            self._optimizers[name] = None

    def note_forward(self) -> None:
        """Called at the model's first forward of a step: is autocast on, and in which dtype."""
        if self._autocast_dtype is not None:
            return
        torch = self._torch
        for device_type in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device_type):
                self._autocast_dtype = str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
                return

    def note_model(self, model: Any) -> None:
        self._model_class = model_class(model)
        params = list(model.parameters())
        self._parameter_count = sum(int(p.numel()) for p in params)
        if params:
            self._parameter_dtype = str(params[0].dtype).removeprefix("torch.")
        try:
            self._fingerprint = ModelFingerprint.of(self._torch, model)
        except Exception:  # a module the walk cannot read: no fingerprint, the rest still reports
            log.warning("fleetprof hooks: no fingerprint for %s", self._model_class, exc_info=True)
            self._fingerprint = None

    # ------------------------------------------------------------------ the DataLoader's batch_size

    def patch_dataloader(self) -> None:
        """Wrap `DataLoader.__iter__` once so that each iteration notes the loader's batch_size."""
        loader_cls = self._torch.utils.data.DataLoader
        original = loader_cls.__iter__
        notes = self._loader_batch_sizes

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            try:
                size = getattr(loader, "batch_size", None)
                if isinstance(size, int) and not isinstance(size, bool) and size > 0 and len(notes) < 20:
                    notes[size] = None
            except Exception:  # never into the user's loop
                pass
            return original(loader)

        loader_cls.__iter__ = __iter__
        self._patched = (loader_cls, original)

    def unpatch_dataloader(self) -> None:
        if self._patched is not None:
            loader_cls, original = self._patched
            loader_cls.__iter__ = original
            self._patched = None

    # ------------------------------------------------------------------ the event's fields

    def batch_size(self) -> tuple[int | None, str | None]:
        loaders = list(self._loader_batch_sizes)
        if self._leading_dims:
            common = self._leading_dims.most_common(1)[0][0]
            return common, "dataloader" if common in loaders else "forward_input"
        if loaders:
            return loaders[0], "dataloader"
        return None, None

    def info(self, *, cuda: bool) -> dict[str, Any]:
        batch, batch_source = self.batch_size()
        precision, precision_source = ((self._autocast_dtype, "autocast") if self._autocast_dtype is not None else
                                       (self._parameter_dtype, "parameters" if self._parameter_dtype else None))
        fields: dict[str, Any] = {
            "batch_size": batch, "batch_size_source": batch_source, "model_class": self._model_class,
            "parameter_count": self._parameter_count, "optimizers": list(self._optimizers) or None,
            "precision": precision, "precision_source": precision_source,
            "flops_per_step": None if self.flops_per_step is None else float(self.flops_per_step),
            "flops_per_step_source": "torch.utils.flop_counter:step 1" if self.flops_per_step is not None else None,
        }
        if self._fingerprint is not None:
            fields.update(self._fingerprint.fields(optimizers=list(self._optimizers),
                                                   autocast_dtype=self._autocast_dtype,
                                                   parameter_dtype=self._parameter_dtype))
        else:
            fields["framework"] = FRAMEWORK
        fields.update(self._device(cuda))
        if cuda:  # the allocator settings in force: a recommendation already applied is not made again
            fields["cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")[:500]
        return fields

    def _device(self, cuda: bool) -> dict[str, Any]:
        if cuda:
            cu = self._torch.cuda
            index = int(cu.current_device())
            total_bytes = int(cu.get_device_properties(index).total_memory)
            return {"device": f"cuda:{index}", "device_memory_total_bytes": total_bytes,
                    "device_memory_source": "cuda_device"}
        total = host_memory_bytes()
        return {"device": "cpu", "device_memory_total_bytes": total,
                "device_memory_source": "host_memory" if total is not None else None}
