"""A plain Keras 3 `Model.fit` script (any backend: KERAS_BACKEND): it knows nothing of fleetprof.

Usage: train_keras.py OUT_JSON [EPOCHS] [BATCH]. It times its own train batches with its own callback (from the
previous batch's end, or the epoch's start, to the batch's end) and writes them, with its layer names and batch
sizes, to OUT_JSON. 300 samples are not a multiple of the batch size: each epoch ends with a short batch; the
validation data makes every epoch end with an evaluation that is no train step.
"""

import json
import sys
import time

import keras
import numpy as np

OUT = sys.argv[1]
EPOCHS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 32

keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(300, 24, 24, 3)).astype("float32")
y = np.random.default_rng(1).integers(0, 10, size=(300,))
xv, yv = x[:64], y[:64]

model = keras.Sequential([
    keras.Input((24, 24, 3)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_a"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_b"),
    keras.layers.MaxPooling2D(name="pool"),
    keras.layers.Flatten(name="flatten"),
    keras.layers.Dense(10, name="head"),
], name="small_cnn")
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class OwnTimes(keras.callbacks.Callback):
    """The script's own clock: the same period rule, measured independently of fleetprof."""

    def __init__(self):
        super().__init__()
        self.times, self.start = [], None

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.times.append(now - self.start)
        self.start = now


own = OwnTimes()
model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=(xv, yv), callbacks=[own], verbose=0)
sizes = [min(BATCH, len(x) - i) for i in range(0, len(x), BATCH)] * EPOCHS
with open(OUT, "w") as f:
    json.dump({"backend": keras.backend.backend(), "steps": len(own.times), "batch_times_s": own.times,
               "batch_sizes": sizes, "layers": [layer.name for layer in model.layers],
               "params": int(model.count_params())}, f)
print("STEPS", len(own.times))
