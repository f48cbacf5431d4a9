"""A JAX program that marks no step: it prints whether the JAX hooks were installed (they are, under the hooks) and
computes something on the device."""

import sys

import jax.numpy as jnp

hooks = sys.modules.get("agent.hooks.jax")
print("INSTALLED", hooks is not None and hooks.current() is not None, float(jnp.arange(4.0).sum()))
