"""A Keras 3 model trained with `fit` (any backend: KERAS_BACKEND), knowing nothing of fleetprof, for fingerprints.

Usage: keras_models.py OUT_JSON MODEL BATCH [POLICY]. MODEL: `cnn` (a Functional model: a nested Sequential block, a
layer used twice, BatchNormalization, Dropout) or `mlp` (a Sequential of Dense layers). POLICY: a Keras dtype
policy (`mixed_float16`, `mixed_bfloat16`; default float32). One epoch of 96 samples. Writes to OUT_JSON what the
script itself knows: its backend, batches, the model's class and the optimizer `compile` left on it. Layers are
made before the model, some unnamed, so that Keras's automatic names (`dense_3`) differ from run to run."""

import json
import sys

import keras
import numpy as np

OUT, MODEL, BATCH = sys.argv[1], sys.argv[2], int(sys.argv[3])
if len(sys.argv) > 4:
    keras.mixed_precision.set_dtype_policy(sys.argv[4])

keras.utils.set_random_seed(0)
spare = [keras.layers.Dense(3) for _ in range(BATCH % 5)]  # shifts the automatic names with the batch size
x = np.random.default_rng(0).normal(size=(96, 16, 16, 3)).astype("float32")
y = np.random.default_rng(1).integers(0, 10, size=(96,))

if MODEL == "cnn":
    inputs = keras.Input((16, 16, 3))
    block = keras.Sequential([keras.layers.Conv2D(8, 3, padding="same"), keras.layers.BatchNormalization(),
                              keras.layers.ReLU()])
    h = block(inputs)
    shared = keras.layers.Conv2D(8, 3, padding="same", activation="relu")
    h = shared(shared(h))  # one layer, two calls: one set of weights
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Dropout(0.1)(h)
    outputs = keras.layers.Dense(10, dtype="float32")(h)
    model = keras.Model(inputs, outputs)
else:
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, dtype="float32")])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Count(keras.callbacks.Callback):
    batches = 0

    def on_train_batch_end(self, batch, logs=None):
        Count.batches += 1


model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[Count()], verbose=0)
with open(OUT, "w") as f:
    json.dump({"backend": keras.backend.backend(), "steps": Count.batches, "model": type(model).__name__,
               "optimizer": type(model.optimizer).__name__, "policy": model.dtype_policy.name}, f)
print("STEPS", Count.batches)
