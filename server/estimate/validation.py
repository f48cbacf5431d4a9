"""The tracer's twin check on CPU: the estimator's own step (and emulation), run for real under `torch.profiler`.

Not an independent reference: it shares the step code and the CUDA emulation, so it checks the meta tracer only
(tests/estimate/test_accuracy.py). The independent reference is server/estimate/reference.py.

The profiler reports every CPU allocator call as a `[memory]` event (+bytes / -bytes). The peak of the
running sum, plus the storages that existed before profiling started (parameters, buffers, inputs), is the
peak the step allocated. The CPU allocator neither caches nor rounds, so this is comparable with the
estimator's *unrounded* figure (`peak_requested_bytes`), not with the CUDA-rounded one.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from server.estimate.models import ResolvedModel
from server.estimate.trace_step import StepSettings, baseline_tensors, prepare, run_steps


def _unique_storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def measure_cpu_peak(resolved: ResolvedModel, settings: StepSettings, batch_size: int, seed: int = 0) -> int:
    """Peak bytes allocated by a real CPU training step (baseline + running max of the profiler's events)."""
    torch.manual_seed(seed)
    cpu = torch.device("cpu")
    model, batch, optimizer, emulation = prepare(resolved, settings, batch_size, cpu)
    baseline = _unique_storage_bytes(baseline_tensors(model, batch))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_steps(model, batch, optimizer, emulation, settings)
    events = [
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(prof.profiler.kineto_results.events())
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    events.sort()  # by time; ties keep recording order
    live = peak = 0
    for _, _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return baseline + peak
