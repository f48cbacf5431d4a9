"""What keeps the largest-batch search cheap (bench/estimate_speed.py measures the time): a few traces, whatever
the batch sizes probed, and a bounded replay only where the unbounded one does not settle the fit."""

from __future__ import annotations

import pytest

from server.estimate import service
from server.estimate.schemas import EstimateRequest

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}


@pytest.mark.parametrize("batch", [1, 3])
def test_search_traces_at_most_four_batch_sizes(monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """Batch 1 takes other code paths in Llama (the affine fit from 1 failed and the search traced every probe):
    the affine model starts at 2, so batch 1 costs one trace more, not one per probe."""
    traced: list[int] = []
    real = service.trace_step

    def counting(resolved, settings, batch_size, kernels=None):  # type: ignore[no-untyped-def]
        traced.append(batch_size)
        return real(resolved, settings, batch_size, kernels)

    monkeypatch.setattr(service, "trace_step", counting)
    request = EstimateRequest.model_validate({"model": {"hf_config": LLAMA}, "seq_len": 32, "batch_size": batch,
                                              "gpu_types": ["T4", "H100-80GB"]})
    result = service.estimate(request, search_budget_s=600.0)  # wall-clock budget: generous on a shared machine
    assert all(g.max_batch_size is not None and g.max_batch_size > 1000 and g.max_batch_size_exact
               for g in result.gpus)
    assert len(traced) == len(set(traced)) <= 4, traced


def test_bounded_replay_equals_a_full_bounded_replay() -> None:
    """The shortcut (fits when the unbounded run never reserves more than the device; cannot fit when its live
    blocks alone exceed it) gives the same verdict as replaying on the bounded device, on both sides of the edge."""
    from server.analysis.planning.allocator import CachingAllocatorSim, SimulatedOutOfMemory
    from server.estimate.models import resolve
    from server.estimate.schemas import ModelSpec
    from server.estimate.trace_step import StepSettings

    est = service._Estimator(resolve(ModelSpec(hf_config=LLAMA), [], 32, "auto"), StepSettings())
    free = est.replay(4, 0, None).stats
    for capacity in (free.peak_allocated_bytes - 1, free.peak_allocated_bytes, free.peak_reserved_bytes - 1,
                     free.peak_reserved_bytes, free.peak_reserved_bytes + 2**20):
        sim = CachingAllocatorSim(capacity)
        try:
            sim.replay(est.events(4, 0))
            fits = True
        except SimulatedOutOfMemory:
            fits = False
        assert est.replay(4, 0, capacity).fits == fits, capacity
