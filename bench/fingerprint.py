"""What the hooks pay once per job for its fingerprint (agent/hooks/fingerprint.py): one walk of the module tree and a
sha256 of its description, timed on models built on the meta device (no weights), from a small CNN to a 7 B
decoder. Prints a table; figures to bench/out/fingerprint.json.

    PYTHONPATH=$PWD .venv/bin/python bench/fingerprint.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from agent.hooks.fingerprint import ModelFingerprint
from bench.report import write_report
from server.estimate import zoo

REPEATS = 5


def _hf(model_type: str, **config: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        cfg = transformers.AutoConfig.for_model(model_type, **config)
        return transformers.AutoModelForCausalLM.from_config(cfg)

    return build


MODELS: list[tuple[str, Callable[[], torch.nn.Module]]] = [
    ("resnet_small", zoo.resnet_small),
    ("resnet50", zoo.resnet50),
    ("vgg16", zoo.vgg16),
    ("gpt2 (124 M)", _hf("gpt2")),
    ("llama 7 B (32 layers)", _hf("llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                  num_attention_heads=32, vocab_size=32000)),
]


def main() -> None:
    figures: dict[str, Any] = {}
    print(f"{'model':<24}{'modules':>9}{'parameters':>16}{'fingerprint ms (median of 5)':>31}")
    for name, build in MODELS:
        with torch.device("meta"):
            model = build()
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            fp = ModelFingerprint.of(torch, model)
            times.append(time.perf_counter() - t0)
        params = sum(p.numel() for p in model.parameters())
        ms = statistics.median(times) * 1e3
        print(f"{name:<24}{fp.module_count:>9}{params:>16,}{ms:>31.2f}")
        figures[name] = {"module_count": fp.module_count, "parameter_count": params, "fingerprint_ms": ms}
    path = write_report(__file__, figures)
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
