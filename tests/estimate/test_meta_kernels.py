"""Memoised meta kernels (server.estimate.meta_kernels) change how fast a trace is, never what it records: a trace
with them equals a trace without them event for event and op for op, across the layer types, precisions and
optimizers the estimator handles; and what the memo refuses (views, in-place metadata changes) is always run."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from server.estimate.meta_kernels import MetaKernels
from server.estimate.models import resolve
from server.estimate.schemas import InputSpec, ModelSpec
from server.estimate.trace_step import StepSettings, trace_step
from server.estimate.tracer import StorageRecorder

GPT2 = {"model_type": "gpt2", "n_layer": 3, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64}
T5 = {"model_type": "t5", "num_layers": 2, "d_model": 64, "num_heads": 4, "d_ff": 128, "d_kv": 16, "vocab_size": 512}
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}


class _NoMemo(MetaKernels):
    def key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return None


CASES = [
    ("gpt2-adamw", {"hf": GPT2, "seq_len": 32}, StepSettings()),
    ("llama-amp_bf16-sgd", {"hf": LLAMA, "seq_len": 32}, StepSettings(optimizer="sgd_momentum", precision="amp_bf16")),
    ("t5-amp_fp16-adam-for_loop", {"hf": T5, "seq_len": 16},
     StepSettings(optimizer="adam", optimizer_impl="for_loop", precision="amp_fp16")),
    ("resnet-checkpointing", {"factory": "server.estimate.zoo:resnet_small"},
     StepSettings(activation_checkpointing=True, grad_accumulation=2)),
]


@pytest.mark.parametrize(("name", "spec", "settings"), CASES, ids=[c[0] for c in CASES])
def test_memoised_trace_equals_plain_trace(name: str, spec: dict, settings: StepSettings) -> None:
    if "hf" in spec:
        resolved = resolve(ModelSpec(hf_config=spec["hf"]), [], spec["seq_len"], "auto")
    else:
        resolved = resolve(ModelSpec(factory=spec["factory"]), [InputSpec(shape=[3, 32, 32])], None, "auto")
    plain = trace_step(resolved, settings, 3, _NoMemo())
    kernels = MetaKernels()
    for batch in (3, 4, 3):  # the second 3 is answered from the memo filled by the first
        memo = trace_step(resolved, settings, batch, kernels)
    assert kernels.hits > kernels.misses  # layers and steps repeat: most calls are answered from the memo
    assert memo.trace.events == plain.trace.events
    assert memo.trace.ops == plain.trace.ops
    assert memo.marks == plain.marks


def test_views_and_metadata_changes_always_run() -> None:
    kernels = MetaKernels()
    with StorageRecorder(kernels=kernels):
        for _ in range(2):
            x = torch.empty(4, 6, device="meta")
            v = x.view(6, 4)  # a view: must share x's storage, never a fresh tensor
            assert v.untyped_storage()._cdata == x.untyped_storage()._cdata
            x.transpose_(0, 1)  # in place, changes the metadata: must run every time
            assert x.shape == (6, 4)
            y = torch.empty(2, device="meta")
            y.set_(torch.empty(5, device="meta").untyped_storage())  # swaps the storage, shape [2] -> [5]
            assert y.shape == (5,)
            s = torch.empty(3, device="meta").add_(1.0)  # in place, nothing changes: answered from the memo
            assert s.shape == (3,)
    assert kernels.hits >= 1
