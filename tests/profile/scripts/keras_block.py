"""A real Keras 3 `Model.fit` (KERAS_BACKEND picks the backend) profiled by `fleetprof.profile()` in local mode, then
a real JAX loop with a `@train_step` update in a second block. Usage: keras_block.py EPOCHS BATCH JAX_STEPS. Prints
one JSON line per block: what the program counted itself (its own callback's batches; its own loop's calls) and
what the block's result says."""

import json
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np

import fleetprof
from agent.hooks.jax import train_step

EPOCHS, BATCH, JAX_STEPS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(100, 12)).astype("float32")
y = np.random.default_rng(1).normal(size=(100, 1)).astype("float32")
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                          keras.layers.Dense(1, name="out")])
model.compile(optimizer=keras.optimizers.RMSprop(1e-3), loss="mse")


class Count(keras.callbacks.Callback):
    batches = 0

    def on_train_batch_end(self, batch, logs=None):
        Count.batches += 1


def show(result, counted, tag):
    print(json.dumps({"tag": tag, "counted": counted, "job_id": result.job_id, "mode": result.mode,
                      "state": result.state, "hooks": result.hooks, "hooked": list(result.hooked),
                      "json": str(result.report_json_path)}), flush=True)


with fleetprof.profile(name="keras-block") as block:
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=[Count()], verbose=0)
show(block.result, Count.batches, "keras")


@train_step
@jax.jit
def update(params, batch):
    xs, ys = batch

    def loss_fn(p):
        return jnp.mean((xs @ p["w"] + p["b"] - ys) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), loss


with fleetprof.profile(name="jax-block") as jax_block:
    params = {"w": jnp.zeros((12, 1)), "b": jnp.zeros(1)}
    calls = 0
    for i in range(JAX_STEPS):
        params, loss = update(params, (jnp.asarray(x[i * 10:(i + 1) * 10]), jnp.asarray(y[i * 10:(i + 1) * 10])))
        calls += 1
show(jax_block.result, calls, "jax")
