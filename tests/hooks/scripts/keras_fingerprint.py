"""Keras models' fingerprints in this process's backend (KERAS_BACKEND), through the hooks' own functions. Prints
one JSON object: per case, the fingerprint fields the Keras hooks would send (and the tree for `functional`).

Cases: `functional` (a nested Sequential, a layer used twice, BatchNormalization), `functional_again` (the same
built a second time, so every automatic layer name differs), `seq_input` / `seq_no_input` (one Sequential with and
without `keras.Input`), `seq_frozen` (its first layer frozen), `seq_wide` (a wider hidden layer), `seq_bf16` (under
mixed_bfloat16), `seq_sgd` (another optimizer)."""

import json

import keras

from agent.hooks.fingerprint import ModelFingerprint, keras_optimizer_name, keras_precision
from fleetprof.fingerprint import describe_keras_model


def functional():
    inputs = keras.Input((8, 8, 3))
    h = keras.Sequential([keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(), keras.layers.ReLU()])(inputs)
    shared = keras.layers.Conv2D(4, 3, padding="same")
    h = keras.layers.Flatten()(shared(shared(h)))
    return keras.Model(inputs, keras.layers.Dense(2)(h))


def seq(width=16, with_input=True):
    layers = [keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential([keras.Input((8,)), *layers] if with_input else layers)
    if not with_input:
        model.build((None, 8))
    return model


def fields(model, optimizer="adam"):
    model.compile(optimizer=optimizer, loss="mse")
    name = keras_optimizer_name(model.optimizer)
    out = ModelFingerprint.of_keras(keras, model).fields(optimizers=[name], precision_mode=keras_precision(
        model.dtype_policy))
    return {**out, "optimizer_seen": type(model.optimizer).__name__}


cases = {"functional": fields(functional()), "functional_again": fields(functional())}
cases["tree"] = describe_keras_model(functional()).model_dump()
cases["seq_input"] = fields(seq())
cases["seq_no_input"] = fields(seq(with_input=False))
frozen = seq()
frozen.layers[0].trainable = False
cases["seq_frozen"] = fields(frozen)
cases["seq_wide"] = fields(seq(width=32))
cases["seq_sgd"] = fields(seq(), optimizer="sgd")
keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
cases["seq_bf16"] = fields(seq())
keras.mixed_precision.set_dtype_policy("mixed_float16")
cases["seq_f16"] = fields(seq())
print(json.dumps(cases))
