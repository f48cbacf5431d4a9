"""Step-time overhead of the fleetprof Keras hooks (issue #22): `Model.fit` with and without the injected callback.

A small Keras MLP (trivial steps, where the hooks' cost shows most) and a small CNN train on random data on the
backend named by KERAS_BACKEND (jax by default). In one process, epochs alternate between the plain `fit` and the
`fit` the installed `agent.hooks.keras.KerasProfiler` patches, so that machine noise falls on both alike. The plain
epochs carry a no-op callback that is not `async_safe` either, so both run Keras's synchronous callback path: the
difference is the hooks' own work (step events, RSS reads, layer events every `--layer-every` steps, the sender
thread's HTTP posts to a local sink that answers like the collector). Step time is process CPU time per step (all
threads, the sender's included) and wall time per step, medians over rounds of per-epoch means.

    KERAS_BACKEND=jax python bench/keras_hook_overhead.py [--rounds 5] [--batches 200] [--layer-every 100]

Prints a table and writes bench/out/keras_hook_overhead.json.

Measured 2026-11-25 (wip/keras) on the shared 2-core CPU dev machine (load average ~5.5, Keras 3.15.1):

    backend (rounds x steps)   model   CPU/step off -> on      wall/step off -> on
    jax (5 x 150)              mlp     81.8 -> 87.8 us         82.0 -> 92.6 us      (+6 us CPU, +11 us wall)
    jax (5 x 150)              cnn     550 -> 524 us           786 -> 595 us        (noise: > the hooks' cost)
    torch (3 x 150)            mlp     1473 -> 1353 us         4032 -> 3148 us      (noise)
    torch (3 x 150)            cnn     38.4 -> 42.0 ms         82.4 -> 91.3 ms      (noise: +-20 % between rounds)

The hooks' own work on the training thread, timed alone (the two callback bodies, 20,000 steps, no sender): ~2 us of
CPU per step. Only the trivial-step figure reads above this machine's noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from agent.hooks.keras import KerasProfiler  # noqa: E402
from agent.hooks.sender import EventSender  # noqa: E402
from bench.hook_overhead import start_sink  # noqa: E402
from bench.report import write_report  # noqa: E402
from fleetprof.client import Client  # noqa: E402


def make_models() -> dict[str, tuple[keras.Model, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    mlp = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    mlp.compile(optimizer="sgd", loss="mse")
    cnn = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
                            keras.layers.Flatten(), keras.layers.Dense(10)])
    cnn.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return {"mlp": (mlp, rng.normal(size=(4096, 16)).astype("float32"), rng.normal(size=(4096, 1)).astype("float32")),
            "cnn": (cnn, rng.normal(size=(4096, 16, 16, 3)).astype("float32"), rng.integers(0, 10, size=(4096,)))}


class Noop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
        pass


def epoch_cost(model: keras.Model, x: np.ndarray, y: np.ndarray, batches: int) -> tuple[float, float]:
    """(process CPU s, wall s) per step of one epoch of `batches` steps."""
    n = batches * 16
    c0, w0 = time.process_time(), time.perf_counter()
    model.fit(x[:n], y[:n], batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[Noop()])
    return (time.process_time() - c0) / batches, (time.perf_counter() - w0) / batches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--layer-every", type=int, default=100)
    args = ap.parse_args(argv)
    sink, url = start_sink()
    prof = KerasProfiler(keras, job_id="bench-keras", sender=EventSender(Client(url, "tok")),
                         layer_every=args.layer_every)
    figures: dict[str, dict[str, float | None]] = {}
    try:
        models = make_models()
        for model, x, y in models.values():  # compile every shape once, outside the measurement
            epoch_cost(model, x, y, 8)
            model.fit(x[:16 * 8], y[:16 * 8], batch_size=16, epochs=1, verbose=0)
        rows = []
        for name, (model, x, y) in models.items():
            off: list[tuple[float, float]] = []
            on: list[tuple[float, float]] = []
            for _ in range(args.rounds):
                off.append(epoch_cost(model, x, y, args.batches))
                prof.install(send_job_start=False, process_hooks=False)
                on.append(epoch_cost(model, x, y, args.batches))
                prof.close(timeout_s=5.0)  # unpatches fit; the sender flushed
                prof.sender = EventSender(Client(url, "tok"))
            cpu_off, cpu_on = (statistics.median(c for c, _ in s) for s in (off, on))
            wall_off, wall_on = (statistics.median(w for _, w in s) for s in (off, on))
            figures[name] = {"step_cpu_off_us": cpu_off * 1e6, "step_cpu_on_us": cpu_on * 1e6,
                             "hooks_cpu_per_step_us": (cpu_on - cpu_off) * 1e6,
                             "step_wall_off_us": wall_off * 1e6, "step_wall_on_us": wall_on * 1e6,
                             "overhead_cpu_pct": 100.0 * (cpu_on - cpu_off) / cpu_off if cpu_off > 0 else None}
            rows.append((name, cpu_off * 1e6, cpu_on * 1e6, wall_off * 1e6, wall_on * 1e6,
                         figures[name]["overhead_cpu_pct"]))
    finally:
        sink.terminate()
        sink.wait()
    print(f"backend {keras.backend.backend()}, {args.rounds} rounds x {args.batches} steps, layers every "
          f"{args.layer_every}")
    print(f"{'model':6} {'cpu off us':>11} {'cpu on us':>10} {'wall off us':>12} {'wall on us':>11} {'cpu ovh %':>10}")
    for name, c0, c1, w0, w1, pct in rows:
        print(f"{name:6} {c0:11.1f} {c1:10.1f} {w0:12.1f} {w1:11.1f} "
              f"{'unknown' if pct is None else format(pct, '.1f'):>10}")
    write_report(__file__, {"backend": keras.backend.backend(), "rounds_count": args.rounds,
                                         "steps_per_epoch_count": args.batches, **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
