"""What the Keras and JAX hooks pay once per job for the fingerprint (agent/hooks/fingerprint.py): one walk of a Keras
layer tree (`of_keras`) or of a JAX parameter pytree (`of_pytree`) and a sha256 of its description. Keras models
from keras.applications (random weights, built on the CPU, in the backend KERAS_BACKEND names); JAX trees of
zero-filled arrays shaped as a decoder's parameters. Prints a table; figures to bench/out/fingerprint_keras.json.

    KERAS_BACKEND=jax PYTHONPATH=$PWD .venv/bin/python bench/fingerprint_keras.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import keras
import numpy as np

from agent.hooks.fingerprint import ModelFingerprint
from bench.report import write_report

REPEATS = 5


def _decoder(layers: int, width: int) -> dict[str, Any]:
    """A decoder's parameter pytree (flax-like nesting); numpy zeros, broadcast: shapes without the memory."""
    def arr(*shape: int) -> np.ndarray:
        return np.broadcast_to(np.zeros((), "float32"), shape)

    block = {"attn": {"q": arr(width, width), "k": arr(width, width), "v": arr(width, width), "o": arr(width, width)},
             "mlp": {"up": arr(width, 4 * width), "down": arr(4 * width, width)}, "norm": arr(width)}
    return {"embed": arr(32000, width), **{f"layer_{i}": dict(block) for i in range(layers)}, "head": arr(width, 32000)}


KERAS_MODELS: list[tuple[str, Callable[[], Any]]] = [
    ("keras MobileNetV2", lambda: keras.applications.MobileNetV2(weights=None)),
    ("keras ResNet50", lambda: keras.applications.ResNet50(weights=None)),
]
JAX_TREES: list[tuple[str, Callable[[], Any]]] = [
    ("jax decoder 12 x 768", lambda: _decoder(12, 768)),
    ("jax decoder 32 x 4096", lambda: _decoder(32, 4096)),
]


def _median_ms(fn: Callable[[], ModelFingerprint]) -> tuple[ModelFingerprint, float]:
    times = []
    fp = fn()
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fp = fn()
        times.append(time.perf_counter() - t0)
    return fp, statistics.median(times) * 1e3


def main() -> None:
    figures: dict[str, Any] = {"keras_backend": keras.backend.backend()}
    print(f"{'model':<26}{'modules':>9}{'parameters':>16}{'fingerprint ms (median of 5)':>31}")
    rows = [(name, build(), "keras") for name, build in KERAS_MODELS] + \
        [(name, build(), "jax") for name, build in JAX_TREES]
    for name, model, kind in rows:
        if kind == "keras":
            fp, ms = _median_ms(lambda m=model: ModelFingerprint.of_keras(keras, m))
        else:
            fp, ms = _median_ms(lambda m=model: ModelFingerprint.of_pytree(jax, m))
        print(f"{name:<26}{fp.module_count:>9}{fp.parameter_count or 0:>16,}{ms:>31.2f}")
        figures[name] = {"module_count": fp.module_count, "parameter_count": fp.parameter_count, "fingerprint_ms": ms}
    path = write_report(__file__, figures)
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
