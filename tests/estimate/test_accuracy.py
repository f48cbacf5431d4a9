"""Predicted peak vs the peak a real CPU training step allocates, measured by torch.profiler.

The acceptance of the estimator on this CPU: the meta-device trace must predict, within 5%, the peak that
`torch.profiler.profile(profile_memory=True)` sees for the same model, batch, optimizer and precision.
The CPU allocator neither caches nor rounds, so the comparison is with the estimator's unrounded figure
(`peak_requested_bytes`, the sum of live tensor sizes); the CUDA rounding and segment caching on top of it
are the allocator simulation's job (tests/estimate/test_allocator.py). Configs are small variants of the
real architectures (fewer, narrower layers) to keep the suite fast; bench/estimate_accuracy.py runs the
full-size ones.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from server.estimate.models import resolve
from server.estimate.schemas import InputSpec, ModelSpec
from server.estimate.trace_step import StepSettings, trace_step
from server.estimate.validation import measure_cpu_peak

TOLERANCE = 0.05

GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 2048, "n_positions": 256}
BERT = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
        "intermediate_size": 512, "vocab_size": 2048}
T5 = {"model_type": "t5", "num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 512, "d_kv": 32,
      "vocab_size": 2048}
VIT = {"model_type": "vit", "num_hidden_layers": 2, "hidden_size": 96, "num_attention_heads": 3,
       "intermediate_size": 384, "image_size": 64, "patch_size": 16}

CASES: list[tuple[str, dict[str, Any], StepSettings, int]] = [
    ("gpt2", {"hf": GPT2, "seq_len": 64}, StepSettings(), 4),
    ("gpt2-amp_fp16-adam-accum2", {"hf": GPT2, "seq_len": 64},
     StepSettings(optimizer="adam", precision="amp_fp16", grad_accumulation=2), 2),
    ("gpt2-checkpointing-sgd", {"hf": GPT2, "seq_len": 64},
     StepSettings(optimizer="sgd_momentum", activation_checkpointing=True), 4),
    ("gpt2-checkpointing-amp_bf16", {"hf": GPT2, "seq_len": 64},
     StepSettings(precision="amp_bf16", activation_checkpointing=True), 4),
    ("bert", {"hf": BERT, "seq_len": 64}, StepSettings(), 4),
    ("t5-amp_bf16", {"hf": T5, "seq_len": 32}, StepSettings(precision="amp_bf16"), 2),
    ("vit", {"hf": VIT}, StepSettings(optimizer="adagrad"), 4),
    ("resnet", {"factory": "server.estimate.zoo:resnet_small", "hw": 32}, StepSettings(), 4),
    ("vgg-for_loop", {"factory": "server.estimate.zoo:vgg_small", "hw": 32},
     StepSettings(optimizer="adamw", optimizer_impl="for_loop"), 4),
]


def _resolve(spec: dict[str, Any]):  # type: ignore[no-untyped-def]
    if "hf" in spec:
        return resolve(ModelSpec(hf_config=spec["hf"]), [], spec.get("seq_len"), "auto")
    hw = spec["hw"]
    return resolve(ModelSpec(factory=spec["factory"]), [InputSpec(shape=[3, hw, hw])], None, "auto")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(("name", "spec", "settings", "batch"), CASES, ids=[c[0] for c in CASES])
def test_predicted_peak_matches_cpu_profiler(name: str, spec: dict, settings: StepSettings, batch: int) -> None:
    resolved = _resolve(spec)
    predicted = trace_step(resolved, settings, batch).trace.peak_requested_bytes()
    measured = measure_cpu_peak(resolved, settings, batch)
    assert abs(predicted - measured) <= TOLERANCE * measured, (name, predicted, measured)


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["server.estimate.zoo:resnet50", "server.estimate.zoo:vgg16"])
def test_full_size_cnns(factory: str) -> None:
    resolved = _resolve({"factory": factory, "hw": 64})
    settings = StepSettings()
    predicted = trace_step(resolved, settings, 2).trace.peak_requested_bytes()
    measured = measure_cpu_peak(resolved, settings, 2)
    assert abs(predicted - measured) <= TOLERANCE * measured


def test_batch_size_moves_the_peak() -> None:
    """Activations scale with the batch: a trace at 2x batch must need more, by the activation share."""
    resolved = _resolve({"hf": GPT2, "seq_len": 64})
    small = trace_step(resolved, StepSettings(), 2).trace.peak_requested_bytes()
    large = trace_step(resolved, StepSettings(), 8).trace.peak_requested_bytes()
    assert large > small
