"""The model zoo the estimator benchmarks run over, in one place: `zoo_rows()` (GPU validation, accuracy-sized
models) and `large_rows()` (the speed target: up to 7 B parameters). A larger zoo drops in here, and
bench/validate_gpu.py and bench/estimate_speed.py follow.

A row is an estimate request body without `batch_size` (EstimateRequest, docs/PRODUCT.md) and the batch sizes to
run it at. Models are Hugging Face configs (no weights: built from the config) or factories of the built-in zoo
(server.estimate.zoo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ZooRow:
    name: str
    body: dict[str, Any]  # an EstimateRequest body without batch_size
    batches: tuple[int, ...]


def _hf(config: dict[str, Any], seq_len: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": {"hf_config": config}}
    if seq_len is not None:
        body["seq_len"] = seq_len
    return body


def _factory(factory: str, hw: int) -> dict[str, Any]:
    return {"model": {"factory": factory}, "inputs": [{"shape": [3, hw, hw]}]}


def zoo_rows() -> list[ZooRow]:
    """The accuracy zoo (bench/estimate_accuracy.py's models), sized to run for real on one GPU."""
    return [
        ZooRow("gpt2 (6 layers)", _hf({"model_type": "gpt2", "n_layer": 6}, 128), (1, 4, 8)),
        ZooRow("bert-base (6 layers)", _hf({"model_type": "bert", "num_hidden_layers": 6}, 128), (1, 4, 8)),
        ZooRow("t5-small", _hf({"model_type": "t5"}, 64), (1, 4, 8)),
        ZooRow("vit-base (6 layers)", _hf({"model_type": "vit", "num_hidden_layers": 6}), (1, 4, 8)),
        ZooRow("resnet50 @128px", _factory("server.estimate.zoo:resnet50", 128), (1, 4, 8)),
        ZooRow("vgg16 @64px", _factory("server.estimate.zoo:vgg16", 64), (1, 4, 8)),
    ]


def _inputs(factory: str, *inputs: dict[str, Any]) -> dict[str, Any]:
    return {"model": {"factory": factory}, "inputs": list(inputs)}


def _tokens(n: int, vocab: int = 1000) -> dict[str, Any]:
    return {"shape": [n], "dtype": "int64", "high": vocab}


def heldout_rows() -> list[ZooRow]:
    """Models no estimator constant was taken from: the GPU validation's second set, to check a constant fitted on
    `zoo_rows()` (e.g. the host's cost per op) on models it never saw."""
    return [
        ZooRow("mobilenet_v3 @64px", _factory("server.estimate.zoo:mobilenet_v3", 64), (1, 16)),
        ZooRow("efficientnet_b0 @64px", _factory("server.estimate.zoo:efficientnet_b0", 64), (1, 16)),
        ZooRow("convnext_tiny @64px", _factory("server.estimate.zoo:convnext_tiny", 64), (1, 16)),
        ZooRow("densenet121 @64px", _factory("server.estimate.zoo:densenet121", 64), (1, 16)),
        ZooRow("mlp_mixer @32px", _factory("server.estimate.zoo:mlp_mixer", 32), (1, 16)),
        ZooRow("transformer_encoder 32 tok", _inputs("server.estimate.zoo:transformer_encoder", _tokens(32)), (1, 16)),
        ZooRow("lstm 32x32", _inputs("server.estimate.zoo:lstm", {"shape": [32, 32]}), (1, 16)),
        ZooRow("dlrm", _inputs("server.estimate.zoo:dlrm", {"shape": [13]},
                               {"shape": [4, 8], "dtype": "int64", "high": 5000}), (1, 16)),
        ZooRow("llama (4 layers, 512 wide) seq 256",
               _hf({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
                    "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 8000}, 256), (1, 8)),
        ZooRow("distilbert seq 128", _hf({"model_type": "distilbert"}, 128), (1, 8)),
    ]


ROW_SETS = {"zoo": zoo_rows, "heldout": heldout_rows}


LLAMA_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}


def large_rows() -> list[ZooRow]:
    """The speed target's models: up to 7 B parameters, on the meta device only (never run for real here)."""
    return [
        ZooRow("llama-7B seq 2048", _hf(LLAMA_7B, 2048), (1,)),
        ZooRow("llama-7B seq 512", _hf(LLAMA_7B, 512), (1,)),
        ZooRow("mistral-7B (GQA) seq 1024", _hf(MISTRAL_7B, 1024), (1,)),
        ZooRow("gpt2-xl (1.5B) seq 1024", _hf({"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25},
                                              1024), (1,)),
        ZooRow("bert-large seq 512", _hf({"model_type": "bert", "num_hidden_layers": 24, "hidden_size": 1024,
                                          "num_attention_heads": 16, "intermediate_size": 4096}, 512), (8,)),
        ZooRow("resnet50 @224px", _factory("server.estimate.zoo:resnet50", 224), (32,)),
    ]
