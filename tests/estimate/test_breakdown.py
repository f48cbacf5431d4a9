"""The estimate's memory breakdown at the peak, against sizes computed by hand from the model's shapes."""

from __future__ import annotations

from server.estimate.schemas import EstimateRequest
from server.estimate.service import estimate
from tests.estimate.registered import REGISTERED

WIDTH, DEPTH, BATCH = 256, 3, 8192
MLP = {"factory": "tests.estimate.factories:mlp", "kwargs": {"width": WIDTH, "depth": DEPTH}}


def test_breakdown_of_an_mlp_step_at_its_activation_peak() -> None:
    result = estimate(EstimateRequest.model_validate(
        {"model": MLP, "inputs": [{"shape": [WIDTH]}], "batch_size": BATCH, "gpu_types": ["H100-80GB"],
         "search_max_batch": False}), registered=REGISTERED)
    b = result.breakdown
    assert b is not None
    params = DEPTH * (WIDTH * WIDTH + WIDTH) + WIDTH * 10 + 10
    assert b.weights.bytes == 4 * params
    assert b.inputs.bytes == 4 * BATCH * WIDTH
    # nn.Sequential(Linear, ReLU) x 3, Linear: each ReLU's output is kept for backward (its own and the next
    # Linear's input); the Linear outputs are freed once ReLU has run. fp32, batch x width each.
    assert {(m.module, m.bytes) for m in b.activations_by_module} == {(str(i), 4 * BATCH * WIDTH) for i in (1, 3, 5)}
    assert b.activations.bytes == 3 * 4 * BATCH * WIDTH
    # AdamW: exp_avg and exp_avg_sq per parameter, plus the step counters (one scalar per parameter tensor)
    assert 2 * 4 * params <= (b.optimizer_state.bytes or 0) <= 2 * 4 * params + 8 * 2 * (DEPTH + 1)
    assert b.cuda_context.bytes is None and b.total_bytes == result.peak_reserved_bytes
    [h100] = result.gpus
    g = h100.breakdown
    assert g is not None and g.cuda_context.bytes == h100.context_bytes
    assert g.total_bytes == h100.device_total_bytes  # the parts add up to what NVML would show
    # one cuBLAS workspace per handle: the training thread's and the autograd engine's (measured on an H100)
    assert (g.temporaries_and_workspaces.bytes or 0) - (b.temporaries_and_workspaces.bytes or 0) == \
        2 * h100.cublas_workspace_bytes


def test_nested_modules_count_for_their_top_level_ancestor() -> None:
    import torch
    from torch import nn

    from server.estimate.breakdown import StepOrigins, classify
    from server.estimate.tracer import StorageRecorder

    model = nn.Sequential(nn.Sequential(nn.Linear(64, 64), nn.ReLU()), nn.Linear(64, 256)).to("meta")
    x = torch.empty(128, 64, device="meta")
    recorder = StorageRecorder(count_ops=False)
    recorder.register([*model.parameters(), x])
    origins = StepOrigins(recorder, model, torch.optim.SGD(model.parameters(), lr=0.1))
    origins.register_baseline([x])
    with recorder, origins:
        out = model(x)  # peak: when the last Linear's (larger) output is allocated
        del out
    parts = classify(recorder.trace, origins.origins)
    assert parts["activation:0"] == 4 * 128 * 64  # the ReLU's output; the inner Linear's died when ReLU returned
    assert parts["activation:1"] == 4 * 128 * 256
    assert parts["inputs"] == 4 * 128 * 64 and parts["weights"] == 4 * (64 * 64 + 64 + 64 * 256 + 256)
