"""The `device: cpu` estimate against the independent reference (server/estimate/reference.py: a plain user loop
under torch.profiler, none of the estimator's code) on a few zoo rows of different kinds, and the zoo's wiring.

Rows are chosen to exercise the CPU-specific paths the estimate models: oneDNN's LSTM workspace (kernel probe),
im2col convolution columns at batch 1, transposed convolutions with group norm, AMP bf16 under autocast('cpu'),
the HF causal LM with its own loss. Bounds are issue #17's targets for a single row: within 5 %, never below -3 %.
bench/estimate_accuracy.py runs the whole zoo.
"""

from __future__ import annotations

import pytest
import torch

from server.estimate import zoo
from server.estimate.allowlist import ZOO_FACTORY_NAMES
from server.estimate.explain import explain
from server.estimate.reference import measure_reference_peak
from server.estimate.schemas import EstimateRequest
from server.estimate.service import estimate
from server.estimate.trace_step import StepSettings, trace_step
from server.estimate.zoo.catalogue import ZOO, architectures

ROWS = [  # (zoo name, precision, optimizer, batch)
    ("lstm/bi2", "fp32", "sgd", 4),
    ("resnet18", "fp32", "sgd", 1),
    ("unet", "amp_bf16", "adamw", 2),
    ("hf/llama", "amp_bf16", "sgd", 2),
    ("gat", "fp32", "adamw", 2),
]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _entry(name: str):  # type: ignore[no-untyped-def]
    return next(e for e in ZOO if e.name == name)


@pytest.mark.parametrize(("name", "precision", "optimizer", "batch"), ROWS, ids=[f"{r[0]}-{r[1]}" for r in ROWS])
def test_cpu_estimate_matches_the_independent_reference(name: str, precision: str, optimizer: str,
                                                        batch: int) -> None:
    resolved = _entry(name).resolve()
    settings = StepSettings(optimizer=optimizer, precision=precision, device="cpu", optimizer_impl="for_loop")
    predicted = trace_step(resolved, settings, batch).trace.peak_requested_bytes()
    reference = measure_reference_peak(resolved, optimizer, precision, batch)
    assert reference.consistent, (reference.end_bytes, reference.end_check_bytes)
    error = (predicted - reference.peak_bytes) / reference.peak_bytes
    assert -0.03 <= error <= 0.05, (name, predicted, reference.peak_bytes, error)


def test_the_reference_sees_what_it_allocates() -> None:
    """The baseline holds the batch, the peak grows with it, and the end-of-step storage walk agrees with the
    profiler's running sum (nothing missed, nothing invented)."""
    resolved = _entry("lstm").resolve()
    small = measure_reference_peak(resolved, "sgd", "fp32", 1)
    large = measure_reference_peak(resolved, "sgd", "fp32", 8)
    assert small.consistent and large.consistent
    assert small.baseline_bytes < large.baseline_bytes  # the batch is part of the baseline
    assert large.peak_bytes > small.peak_bytes > small.baseline_bytes


def test_the_cuda_estimate_differs_where_cuda_does() -> None:
    """Dropout on CUDA saves a bool mask (native_dropout), the CPU path a float one: the cuda trace is smaller."""
    resolved = _entry("transformer_encoder").resolve()
    cpu = trace_step(resolved, StepSettings(device="cpu", optimizer="sgd", optimizer_impl="for_loop"), 4)
    cuda = trace_step(resolved, StepSettings(device="cuda", optimizer="sgd", optimizer_impl="for_loop"), 4)
    assert cuda.trace.peak_requested_bytes() < cpu.trace.peak_requested_bytes()


def test_device_cpu_through_the_service() -> None:
    request = EstimateRequest.model_validate({
        "model": {"factory": "server.estimate.zoo:lstm"}, "inputs": [{"shape": [32, 32]}], "batch_size": 4,
        "device": "cpu", "optimizer": "sgd"})
    result = estimate(request)
    assert result.device == "cpu" and result.gpus == []
    assert result.peak_requested_bytes == result.peak_allocated_bytes == result.peak_reserved_bytes > 0
    cuda = estimate(request.model_copy(update={"device": "cuda", "gpu_types": ["T4"], "search_max_batch": False}))
    assert cuda.device == "cuda" and cuda.peak_reserved_bytes >= cuda.peak_allocated_bytes


def test_explain_names_the_first_divergence() -> None:
    """With the kernel probe off, the LSTM's oneDNN workspace is missing: explain points at the LSTM layer."""
    import server.estimate.kernel_probe as probe

    resolved = _entry("lstm").resolve()
    settings = StepSettings(optimizer="sgd", device="cpu", optimizer_impl="for_loop")
    saved = probe.PROBED_OPS
    probe.PROBED_OPS = frozenset()  # read at call time by probe.probed()
    try:
        result = explain(resolved, settings, 2)
    finally:
        probe.PROBED_OPS = saved
    assert result.error_fraction < -0.2
    assert result.first_divergence is not None
    assert any(a.op.startswith("rnn/") for a in result.traced)
    assert "first divergence" in result.format()


def test_zoo_is_allow_listed_and_broad() -> None:
    assert sorted(ZOO_FACTORY_NAMES) == sorted(zoo.__all__)
    assert architectures() >= 40
    families = {e.family for e in ZOO}
    assert {"cnn", "nn_attention", "rnn", "recsys", "graph", "hf_decoder", "hf_encoder", "hf_seq2seq",
            "hf_vision"} <= families
    assert all(len(e.batches) == 3 for e in ZOO)
