"""A decorated `main()` that imports Keras (KERAS_BACKEND picks the backend) only inside the profiled call, then fits:
the block must hook the framework when the program imports it. Usage: keras_inside.py EPOCHS BATCH. Prints one JSON
line: what the program counted itself, what was imported before the block, and what the block's result says."""

import json
import sys

import fleetprof

BEFORE = sorted(name for name in ("torch", "keras", "jax") if name in sys.modules)


block = fleetprof.profile(name="keras-inside")


@block
def main(epochs: int, batch: int) -> int:
    import keras
    import numpy as np

    x = np.random.default_rng(0).normal(size=(60, 6)).astype("float32")
    y = np.random.default_rng(1).normal(size=(60, 1)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")

    class Count(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            Count.batches += 1

    model.fit(x, y, batch_size=batch, epochs=epochs, callbacks=[Count()], verbose=0)
    return Count.batches


counted = main(int(sys.argv[1]), int(sys.argv[2]))
r = block.result
print(json.dumps({"counted": counted, "before": BEFORE, "job_id": r.job_id, "hooked": list(r.hooked),
                  "json": str(r.report_json_path)}))
