"""A plain JAX training loop (an MLP, hand-written SGD) with the one line the fleetprof JAX hooks need:
`@train_step` above the jitted update (a no-op without `fleetprof run`).

Usage: train_jax.py OUT_JSON [STEPS] [BATCH] [marker [params]]. With `marker` the loop ends each step with
`fleetprof_step(samples=..., wait=loss)` instead of the decorator (with `params`: and `params=` the parameter
pytree). It times its own steps (from the previous step's end, the first from its call, to the step's outputs being
ready) and writes them, with its batch sizes, to OUT_JSON. The last batch of the data is short.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from agent.hooks import fleetprof_step
from agent.hooks.jax import train_step

OUT = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 128
MARKER = len(sys.argv) > 4 and sys.argv[4] == "marker"
GIVE_PARAMS = len(sys.argv) > 5 and sys.argv[5] == "params"  # the marker also hands over the parameter pytree

rng = np.random.default_rng(0)
n = BATCH * (STEPS - 1) + BATCH // 2  # the last batch holds half a batch
x_all = rng.normal(size=(n, 256)).astype("float32")
y_all = rng.integers(0, 10, size=(n,))


def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (256, 1024)) * 0.05, "b1": jnp.zeros(1024),
            "w2": jax.random.normal(k2, (1024, 10)) * 0.05, "b2": jnp.zeros(10)}


def loss_fn(params, batch):
    x, y = batch
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def sgd(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss


update = sgd if MARKER else train_step(sgd)  # the decorator's usual place is above @jax.jit


params = init(jax.random.PRNGKey(0))
times, sizes = [], []
prev = time.perf_counter()
for i in range(STEPS):
    batch = (jnp.asarray(x_all[i * BATCH:(i + 1) * BATCH]), jnp.asarray(y_all[i * BATCH:(i + 1) * BATCH]))
    params, loss = update(params, batch)
    if MARKER:
        fleetprof_step(samples=batch[0].shape[0], wait=loss, params=params if GIVE_PARAMS else None)
    jax.block_until_ready(loss)
    now = time.perf_counter()
    times.append(now - prev)
    prev = now
    sizes.append(int(batch[0].shape[0]))
with open(OUT, "w") as f:
    json.dump({"steps": len(times), "batch_times_s": times, "batch_sizes": sizes}, f)
print("STEPS", len(times), "LOSS", float(loss))
