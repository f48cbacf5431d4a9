"""How `keras-cnn-cpu.trace.json.gz` was made (2026-11-25, TensorFlow 2.21.0 CPU, Keras 3.15.1, xprof 2.24.2).

1. Profile three train steps of a small Keras CNN with TensorFlow's profiler (what
   `keras.callbacks.TensorBoard(profile_batch=(3, 5))` does, without TensorBoard installed), which writes
   `<logdir>/train/plugins/profile/<run>/<host>.xplane.pb`:
       KERAS_BACKEND=tensorflow python make_trace.py profile /tmp/tflog
2. Convert it as TensorBoard's profile plugin does for its trace viewer (xprof's `xspace_to_tool_data`, tool
   "trace_viewer"), into the JSON TensorFlow used to write beside the profile as `<host>.trace.json.gz`:
       python make_trace.py convert /tmp/tflog/train/plugins/profile/<run>/<host>.xplane.pb out.trace.json.gz
"""

import gzip
import sys


def profile(logdir: str) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(256, 16, 16, 3)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, size=(256,))
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
                              keras.layers.Flatten(name="flatten"), keras.layers.Dense(10, name="head")])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Profile(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 3:
                tf.profiler.experimental.start(f"{logdir}/train")

        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                tf.profiler.experimental.stop()

    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[Profile()])


def convert(xplane: str, out: str) -> None:
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([xplane], "trace_viewer", {})
    with gzip.open(out, "wb", compresslevel=9) as f:
        f.write(data.encode() if isinstance(data, str) else data)


if __name__ == "__main__":
    profile(sys.argv[2]) if sys.argv[1] == "profile" else convert(sys.argv[2], sys.argv[3])
