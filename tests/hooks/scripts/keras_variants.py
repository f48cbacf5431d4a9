"""Keras `fit` called the ways users call it, knowing nothing of fleetprof.

Usage: keras_variants.py VARIANT. 2 epochs of 100 samples at batch size 10: 20 train batches. Prints `CALLS <n>`, the
batch-end callbacks its own callback got.
  positional    callbacks passed positionally (fit's 6th argument)
  callbacklist  a keras CallbackList passed as callbacks
  execution     steps_per_execution=3 (the batch callbacks come once per 3 batches)
  torch-first   `import torch` before `import keras` (torch backend): the PyTorch hooks hand over to Keras's
  torch-loop    no fit: a loop of its own steps the Keras model (torch backend) with a torch optimizer, 6 steps
"""

import importlib
import sys

VARIANT = sys.argv[1]
if VARIANT == "torch-first":
    importlib.import_module("torch")  # before keras, on purpose

keras = importlib.import_module("keras")
np = importlib.import_module("numpy")

keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(100, 8)).astype("float32")
y = np.random.default_rng(1).normal(size=(100, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                          keras.layers.Dense(1, name="out")])
model.compile(optimizer="sgd", loss="mse", steps_per_execution=3 if VARIANT == "execution" else 1)


class Count(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def on_train_batch_end(self, batch, logs=None):
        self.calls += 1


count = Count()
if VARIANT == "torch-loop":
    torch = importlib.import_module("torch")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for i in range(6):
        opt.zero_grad()
        loss = ((model(xt[i * 10:(i + 1) * 10]) - yt[i * 10:(i + 1) * 10]) ** 2).mean()
        loss.backward()
        opt.step()
        count.calls += 1
elif VARIANT == "positional":
    model.fit(x, y, 10, 2, 0, [count])
elif VARIANT == "callbacklist":
    model.fit(x, y, batch_size=10, epochs=2, verbose=0, callbacks=keras.callbacks.CallbackList([count], model=model))
else:
    model.fit(x, y, batch_size=10, epochs=2, verbose=0, callbacks=[count])
print("CALLS", count.calls)
